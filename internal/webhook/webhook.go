// Package webhook delivers tenants' events to their HTTPS endpoints: each event becomes a
// delivery row (store.FanOutWebhooks), any controller replica claims due deliveries with
// SKIP LOCKED, POSTs them signed with the webhook's HMAC-SHA256 secret, records every attempt
// and retries with exponential backoff until the delivery is delivered or, past its bounded
// retry time, dead. All state is in PostgreSQL, so a restart loses nothing.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// The headers of a delivery. Signature is "v1=" and the lowercase hex HMAC-SHA256, keyed with
// the webhook's secret, of the Timestamp header's value, a ".", and the raw body.
const (
	HeaderID        = "Gpuaas-Webhook-Id"
	HeaderTimestamp = "Gpuaas-Webhook-Timestamp"
	HeaderSignature = "Gpuaas-Webhook-Signature"
	HeaderEvent     = "Gpuaas-Event-Type"
)

// Payload is a delivery's JSON body: the event as its tenant sees it (never a host identity).
type Payload struct {
	DeliveryID string      `json:"delivery_id"`
	WebhookID  string      `json:"webhook_id"`
	Event      apiv1.Event `json:"event"`
}

// Config tunes delivery.
type Config struct {
	Poll        time.Duration // how often to look for new events and due deliveries (default 1 s)
	Timeout     time.Duration // one attempt's whole HTTPS exchange (default 10 s)
	Lease       time.Duration // a claimed attempt's hold before another replica may retry it (default Timeout+20 s)
	BaseBackoff time.Duration // wait after the first failed attempt, doubling after each (default 5 s)
	MaxBackoff  time.Duration // the longest wait between attempts (default 1 h)
	MaxAge      time.Duration // a delivery not delivered this long after its event is dead (default 24 h)
	// RootCAs are the certificate authorities receivers' certificates must chain to; nil: the
	// system's roots. Certificates are always verified.
	RootCAs *x509.CertPool
	// AllowPrivate lets deliveries reach loopback, private, link-local and other internal
	// addresses; off, such an address is refused at connect time, whatever the name resolved
	// to (no SSRF into the controller's own network).
	AllowPrivate bool
}

func (c *Config) defaults() {
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Lease <= c.Timeout {
		c.Lease = c.Timeout + 20*time.Second
	}
	if c.BaseBackoff <= 0 {
		c.BaseBackoff = 5 * time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = time.Hour
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 24 * time.Hour
	}
}

// Deliverer runs webhook deliveries against one database; run one per controller replica.
type Deliverer struct {
	st   *store.Store
	cfg  Config
	log  *slog.Logger
	http *http.Client
}

// New returns a Deliverer.
func New(st *store.Store, cfg Config, log *slog.Logger) *Deliverer {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout, Control: dialControl(cfg.AllowPrivate)}
	tr := &http.Transport{
		Proxy:               nil, // a proxy would connect on our behalf, past the address check
		DialContext:         dialer.DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: cfg.Timeout,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	return &Deliverer{st: st, cfg: cfg, log: log, http: &http.Client{
		Transport: tr,
		Timeout:   cfg.Timeout,
		// A redirect is an answer, not a new target: following it would reach an address
		// the tenant never registered.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Run delivers until ctx ends.
func (d *Deliverer) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	for {
		n, err := d.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("webhook deliveries", "err", err)
		}
		if n > 0 && err == nil {
			continue // more may be due at once
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// claimBatch is how many deliveries one round claims and attempts concurrently.
const claimBatch = 16

// RunOnce turns new events into deliveries, then makes one attempt at each due delivery it
// claims; it returns how many attempts it made.
func (d *Deliverer) RunOnce(ctx context.Context) (int, error) {
	if _, err := d.st.FanOutWebhooks(ctx, 500); err != nil {
		return 0, fmt.Errorf("fan-out: %w", err)
	}
	due, err := d.st.ClaimWebhookDeliveries(ctx, claimBatch, d.cfg.Lease)
	if err != nil {
		return 0, fmt.Errorf("claim: %w", err)
	}
	var wg sync.WaitGroup
	for _, dd := range due {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.attempt(ctx, dd)
		}()
	}
	wg.Wait()
	return len(due), nil
}

func (d *Deliverer) attempt(ctx context.Context, dd store.DueDelivery) {
	body, err := json.Marshal(Payload{DeliveryID: dd.ID, WebhookID: dd.WebhookID, Event: apiv1.Event{
		Cursor: dd.Event.Cursor.String(), Type: dd.Event.Type, AllocationID: dd.Event.AllocationID,
		Data: dd.Event.Data, CreatedAt: dd.Event.CreatedAt}})
	if err != nil {
		d.log.Error("webhook payload", "delivery", dd.ID, "err", err)
		return
	}
	start := time.Now()
	code, aerr := d.post(ctx, dd, body)
	a := store.WebhookAttempt{DeliveryID: dd.ID, Attempt: dd.Attempt, StatusCode: code, Duration: time.Since(start),
		Delivered: aerr == nil, RetryIn: d.backoff(dd.Attempt), MaxAge: d.cfg.MaxAge}
	if aerr != nil {
		a.Error = aerr.Error()
	}
	if ctx.Err() != nil && aerr != nil {
		// The replica is stopping: the attempt is on record as interrupted and the next one
		// is due after the first backoff, not after the claim's lease.
		a.StatusCode, a.Error, a.RetryIn = 0, "interrupted: the controller replica stopped", d.cfg.BaseBackoff
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	status, err := d.st.RecordWebhookAttempt(rctx, a)
	if err != nil {
		d.log.Warn("recording a webhook attempt", "delivery", dd.ID, "err", err)
		return
	}
	if status == "dead" {
		d.log.Warn("webhook delivery dead", "delivery", dd.ID, "webhook", dd.WebhookID, "attempts", dd.Attempt, "err", a.Error)
	}
}

// post makes one attempt; a 2xx answer is delivered, anything else an error in our words.
func (d *Deliverer) post(ctx context.Context, dd store.DueDelivery, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dd.URL, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("request: %v", err)
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "gpuaas-webhooks/1")
	req.Header.Set(HeaderID, dd.ID)
	req.Header.Set(HeaderEvent, dd.Event.Type)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, Sign(dd.Secret, ts, body))
	resp, err := d.http.Do(req)
	if err != nil {
		return 0, errors.New(describe(err))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("the endpoint answered %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	}
	return resp.StatusCode, nil
}

// describe puts a failed attempt in a tenant-readable sentence.
func describe(err error) string {
	var ue x509.UnknownAuthorityError
	var he x509.HostnameError
	var ce x509.CertificateInvalidError
	switch {
	case errors.Is(err, errPrivateAddress):
		return "refused: the endpoint resolves to a private, loopback or link-local address"
	case errors.As(err, &ue):
		return "TLS: the endpoint's certificate is not signed by a trusted authority"
	case errors.As(err, &he):
		return "TLS: the endpoint's certificate does not name its host"
	case errors.As(err, &ce):
		return "TLS: the endpoint's certificate is invalid: " + ce.Error()
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout"):
		return "the endpoint did not answer in time"
	}
	var ne *net.OpError
	if errors.As(err, &ne) {
		return "connecting to the endpoint failed: " + ne.Err.Error()
	}
	return "delivery failed: " + err.Error()
}

// backoff is the wait after failed attempt n (1-based): BaseBackoff doubling, at most
// MaxBackoff, with up to 20% jitter so a failed receiver is not hit by every delivery at once.
func (d *Deliverer) backoff(n int) time.Duration {
	w := d.cfg.BaseBackoff
	for i := 1; i < n && w < d.cfg.MaxBackoff; i++ {
		w *= 2
	}
	w = min(w, d.cfg.MaxBackoff)
	return w + time.Duration(rand.Int64N(int64(w)/5+1))
}

// Sign is a delivery's signature header value for secret, timestamp and body.
func Sign(secret, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(timestamp))
	m.Write([]byte("."))
	m.Write(body)
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

// Verify checks a delivery as a receiver should: the signature over timestamp and body, in
// constant time, and a timestamp within tolerance of now (a replayed old delivery fails).
func Verify(secret, timestamp, signature string, body []byte, now time.Time, tolerance time.Duration) error {
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return errors.New("webhook: bad timestamp header")
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return errors.New("webhook: timestamp outside the tolerance")
	}
	if !hmac.Equal([]byte(Sign(secret, timestamp, body)), []byte(signature)) {
		return errors.New("webhook: signature mismatch")
	}
	return nil
}

var errPrivateAddress = errors.New("private address refused")

// dialControl refuses internal addresses at connect time, after name resolution, so neither a
// name that resolves inward nor one that changes its answer later (DNS rebinding) gets past.
func dialControl(allowPrivate bool) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		if allowPrivate {
			return nil
		}
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		ip := net.ParseIP(host)
		if ip == nil || Internal(ip) {
			return errPrivateAddress
		}
		return nil
	}
}

var cgnat = &net.IPNet{IP: net.IPv4(100, 64, 0, 0), Mask: net.CIDRMask(10, 32)}

// Internal reports an address a webhook may not reach unless the operator allows private
// addresses: loopback, private (RFC 1918, fc00::/7), link-local (cloud metadata services
// live there), shared (100.64/10), unspecified and multicast.
func Internal(ip net.IP) bool {
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() || cgnat.Contains(ip) ||
		(len(ip) == net.IPv4len && ip[0] == 0)
}

// CheckURL validates a webhook URL at registration: https only, a host, no credentials or
// fragment, at most 2048 bytes; an address literal in the internal ranges is refused unless
// allowPrivate (names are checked again on every connection).
func CheckURL(raw string, allowPrivate bool) error {
	if len(raw) > 2048 {
		return errors.New("url is longer than 2048 bytes")
	}
	u, err := parseURL(raw)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(strings.Trim(u.Hostname(), "[]")); ip != nil && !allowPrivate && Internal(ip) {
		return errors.New("url points at a private, loopback or link-local address, which webhooks may not reach")
	}
	return nil
}
