package api

import (
	"errors"
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// RateLimit is a token bucket: Burst requests at once, then one every Every.
type RateLimit struct {
	Burst int
	Every time.Duration
}

// SecurityConfig tunes authentication hardening. The zero value is production's defaults.
type SecurityConfig struct {
	// AuthFailures limits failed authentications (bad, expired or revoked tokens or
	// certificates, bad terminal session tokens) per client IP; past it failures get 429
	// with Retry-After. Valid credentials are never throttled by it.
	AuthFailures RateLimit
	// Enroll limits failed enrollments (unknown, spent or expired bootstrap tokens) per
	// client IP, more tightly: a bootstrap token mints a host identity. A valid one is never
	// throttled (it is one-time, so it cannot be used to make the CA sign at will).
	Enroll RateLimit
	// RenewGrace is how long a renewed node certificate keeps working after its
	// replacement was issued (requests in flight, a retried renewal whose answer was lost).
	RenewGrace time.Duration
	// Now is the limiters' clock (tests); nil is time.Now.
	Now func() time.Time
}

func (c *SecurityConfig) defaults() {
	if c.AuthFailures.Burst == 0 {
		c.AuthFailures = RateLimit{Burst: 30, Every: time.Second}
	}
	if c.Enroll.Burst == 0 {
		c.Enroll = RateLimit{Burst: 10, Every: 6 * time.Second}
	}
	if c.RenewGrace <= 0 {
		c.RenewGrace = 10 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// ipLimiterMax bounds the buckets kept; past it full (idle) buckets are dropped first.
const ipLimiterMax = 100_000

// ipLimiter is a token bucket per client IP. The client IP is the connection's peer
// address: X-Forwarded-For is not trusted (anyone can write it).
type ipLimiter struct {
	mu    sync.Mutex
	lim   RateLimit
	now   func() time.Time
	bkt   map[string]*bucket
	burst float64
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newIPLimiter(l RateLimit, now func() time.Time) *ipLimiter {
	return &ipLimiter{lim: l, now: now, bkt: map[string]*bucket{}, burst: float64(l.Burst)}
}

// refill brings b up to date at now.
func (l *ipLimiter) refill(b *bucket, now time.Time) {
	if l.lim.Every > 0 && now.After(b.at) {
		b.tokens = math.Min(l.burst, b.tokens+float64(now.Sub(b.at))/float64(l.lim.Every))
	}
	b.at = now
}

// take spends one token of ip's bucket. When none is left it reports how long until one is.
func (l *ipLimiter) take(ip string) (bool, time.Duration) {
	if l.lim.Burst < 0 {
		return true, 0 // disabled
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.bkt[ip]
	if !ok {
		l.prune(now)
		b = &bucket{tokens: l.burst, at: now}
		l.bkt[ip] = b
	}
	l.refill(b, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	if l.lim.Every <= 0 {
		return false, time.Hour
	}
	return false, time.Duration((1 - b.tokens) * float64(l.lim.Every))
}

// prune keeps memory bounded under a flood of distinct addresses.
func (l *ipLimiter) prune(now time.Time) {
	if len(l.bkt) < ipLimiterMax {
		return
	}
	for ip, b := range l.bkt {
		l.refill(b, now)
		if b.tokens >= l.burst {
			delete(l.bkt, ip)
		}
	}
	if len(l.bkt) >= ipLimiterMax {
		l.bkt = map[string]*bucket{}
	}
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func errRateLimited(what string, retry time.Duration) *apiv1.Error {
	secs := max(1, int(math.Ceil(retry.Seconds())))
	return apiErr(apiv1.CodeRateLimited, "too many "+what+" from this address; retry later",
		map[string]any{"retry_after_seconds": secs})
}

// throttleFailure counts an authentication failure against the client's address; once the
// address has spent its failures, the answer becomes 429 (the credential is still checked
// first, so a valid one is never refused because a neighbour behind the same NAT erred).
// Failed enrollments have their own, tighter bucket.
func (s *Server) throttleFailure(r *http.Request, err error) error {
	var ae *apiv1.Error
	if !errors.As(err, &ae) || ae.Code != apiv1.CodeUnauthorized {
		return err
	}
	lim, what := s.authFails, "failed authentications"
	if r.URL.Path == enrollPath {
		lim, what = s.enrolls, "failed enrollments"
	}
	if ok, retry := lim.take(clientIP(r)); !ok {
		return errRateLimited(what, retry)
	}
	return err
}
