// Package client is the Go client of the controller's /api/v1 HTTPS API, used by gpuaasctl,
// the demo and tests. Every method returns the API's typed *apiv1.Error on a non-2xx answer
// and an error matching ErrUnreachable when the controller cannot be reached.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// MaxResponseBytes bounds how much of a response body is read: a misbehaving or hostile
// server must not make the CLI allocate without limit.
const MaxResponseBytes = 16 << 20

// Options configures a Client.
type Options struct {
	// Server is the controller's base URL, https://host:port. Plain http:// is refused.
	// Several comma-separated URLs name controller replicas: requests go to one, and move
	// to the next when it cannot be reached (see do). One load-balancer URL is the usual case.
	Server string
	// CAFile is a PEM CA to trust; empty trusts the system roots. Ignored with HTTPClient.
	CAFile string
	// Token is sent as "Authorization: Bearer TOKEN" when not empty.
	Token string
	// HTTPClient replaces the default client (TLS 1.2+, 60 s timeout, proxy from env).
	HTTPClient *http.Client
	// UserAgent defaults to "gpuaas-client".
	UserAgent string
}

// Client talks to one controller (or fails over between replicas). It is safe for
// concurrent use.
type Client struct {
	bases   []*url.URL
	cur     atomic.Int32 // index into bases of the replica requests go to
	token   string
	hc      *http.Client
	ua      string
	maxBody int64
}

// New validates the options and builds a client. It does not contact the server.
func New(o Options) (*Client, error) {
	var bases []*url.URL
	for _, s := range strings.Split(o.Server, ",") {
		if s = strings.TrimSpace(s); s == "" && len(bases) > 0 {
			continue
		}
		u, err := parseServer(s)
		if err != nil {
			return nil, err
		}
		bases = append(bases, u)
	}
	var err error
	hc := o.HTTPClient
	if hc == nil {
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.CAFile != "" {
			if tlsCfg, err = pki.ClientTLSConfig(o.CAFile); err != nil {
				return nil, err
			}
		}
		// HTTP/1.1 with keep-alive, as hostd speaks: the CLI's calls are sequential
		// request/response, where HTTP/2 only adds its per-stream goroutine hand-offs (in
		// alternating 1-client bench runs, 0.3-1.1 ms more per create+release pair and 0.4-0.7
		// ms more controller CPU; docs/performance.md). A non-nil empty TLSNextProto keeps the
		// transport from negotiating h2. The TUI's concurrent reads get their own connections.
		hc = &http.Client{
			Timeout: 60 * time.Second,
			Transport: &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 4,
				TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}},
		}
	}
	ua := o.UserAgent
	if ua == "" {
		ua = "gpuaas-client"
	}
	return &Client{bases: bases, token: o.Token, hc: hc, ua: ua, maxBody: MaxResponseBytes}, nil
}

// parseServer accepts https://host[:port][/prefix] only: the controller serves TLS only, and
// a token must never travel in clear text.
func parseServer(s string) (*url.URL, error) {
	if s == "" {
		return nil, fmt.Errorf("%w: no controller address (want https://host:port)", ErrInvalidServer)
	}
	u, err := url.Parse(strings.TrimRight(s, "/"))
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("%w: %q is not a URL like https://host:port", ErrInvalidServer, s)
	}
	if u.Scheme == "http" {
		return nil, fmt.Errorf("%w: %q uses plain http://; the controller serves HTTPS only (use https://)", ErrInvalidServer, s)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("%w: %q must not carry credentials, a query or a fragment", ErrInvalidServer, s)
	}
	return u, nil
}

// Server is the base URL of the controller requests go to now.
func (c *Client) Server() string { return c.base().String() }

func (c *Client) base() *url.URL { return c.bases[int(c.cur.Load())%len(c.bases)] }

// request describes one API call.
type request struct {
	method string
	path   string // below the server's base URL, e.g. /api/v1/whoami
	query  url.Values
	header http.Header
	body   any // JSON-encoded when not nil
}

// do performs r and decodes a 2xx body into out (when not nil). It returns the HTTP status.
//
// Failover: a request the controller cannot have applied (the connection was refused, or
// it answered 503 unavailable: its database was away, nothing was committed) or that is
// safe to repeat (GET, PUT, DELETE, or a POST carrying an Idempotency-Key) is tried on
// the next replica, and when every replica has failed, again after a jittered exponential
// backoff (honouring Retry-After), up to maxRounds rounds.
func (c *Client) do(ctx context.Context, r request, out any) (int, error) {
	var body []byte
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return 0, fmt.Errorf("encoding %s %s request: %w", r.method, r.path, err)
		}
		body = b
	}
	attempts := maxRounds * len(c.bases)
	for n := 1; ; n++ {
		idx := c.cur.Load()
		status, retryAfter, err := c.once(ctx, r, body, c.base(), out)
		if err == nil || n >= attempts || ctx.Err() != nil || !retryable(r, status, err) {
			return status, err
		}
		if len(c.bases) > 1 {
			c.cur.CompareAndSwap(idx, (idx+1)%int32(len(c.bases)))
		}
		if n%len(c.bases) == 0 { // every replica tried once more: back off before the next round
			if !sleep(ctx, backoff(n/len(c.bases), retryAfter)) {
				return status, err
			}
		}
	}
}

// maxRounds bounds one call's tries: each replica this many times, about 0.6 s of backoff
// in all (a CLI must not hang on a dead controller; hostd and --wait loops retry longer).
const maxRounds = 3

// retryable reports whether a failed attempt may be repeated (see do).
func retryable(r request, status int, err error) bool {
	idempotent := r.method == http.MethodGet || r.method == http.MethodHead || r.method == http.MethodPut ||
		r.method == http.MethodDelete || r.header.Get("Idempotency-Key") != ""
	var ae *apiv1.Error
	switch {
	case errors.As(err, &ae):
		return ae.Code == apiv1.CodeUnavailable && idempotent
	case errors.Is(err, ErrUnreachable):
		var cv *tls.CertificateVerificationError
		if errors.As(err, &cv) {
			return false // no replica will present another certificate next time
		}
		var op *net.OpError
		return idempotent || (errors.As(err, &op) && op.Op == "dial") // never sent: cannot have applied
	}
	return false
}

// backoff is the wait before retry round n (1, 2, ...): 250 ms doubling, full jitter in
// [d/2, d], at least the server's Retry-After (capped at 5 s).
func backoff(n int, retryAfter time.Duration) time.Duration {
	d := 250 * time.Millisecond << min(n-1, 4)
	d = d/2 + rand.N(d/2+1)
	return max(d, min(retryAfter, 5*time.Second))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// once performs one attempt of r against base. retryAfter is the answer's Retry-After.
func (c *Client) once(ctx context.Context, r request, body []byte, base *url.URL, out any) (status int, retryAfter time.Duration, err error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	// r.path is already escaped (ids go through esc): keep it as RawPath so a "/" or "%" in
	// a node name reaches the server as data, not as a path separator.
	u := *base
	u.RawPath = base.EscapedPath() + r.path
	if u.Path, err = url.PathUnescape(u.RawPath); err != nil {
		return 0, 0, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	u.RawQuery = r.query.Encode()
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), rd)
	if err != nil {
		return 0, 0, err
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.ua)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, 0, ctx.Err() // the caller gave up; the controller may be fine
		}
		return 0, 0, &NetworkError{URL: base.String(), Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s > 0 {
		retryAfter = time.Duration(s) * time.Second
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err != nil {
		if ctx.Err() != nil {
			return resp.StatusCode, 0, ctx.Err()
		}
		return resp.StatusCode, 0, &NetworkError{URL: base.String(), Err: fmt.Errorf("reading response: %w", err)}
	}
	if int64(len(data)) > c.maxBody {
		return resp.StatusCode, 0, fmt.Errorf("%s %s: response exceeds %d bytes", r.method, r.path, c.maxBody)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, retryAfter, decodeError(resp, data)
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, 0, fmt.Errorf("decoding %s %s response: %w", r.method, r.path, err)
		}
	}
	return resp.StatusCode, 0, nil
}

// unwrapURLError drops *url.Error's "Get \"https://...\":" prefix: NetworkError names the server.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func esc(s string) string { return url.PathEscape(s) }

func get[T any](ctx context.Context, c *Client, path string, q url.Values) (*T, error) {
	var out T
	if _, err := c.do(ctx, request{method: http.MethodGet, path: path, query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func list[T any](ctx context.Context, c *Client, path string, q url.Values) ([]T, error) {
	out, err := get[apiv1.List[T]](ctx, c, path, q)
	if err != nil {
		return nil, err
	}
	if out.Items == nil {
		return []T{}, nil
	}
	return out.Items, nil
}

func send[T any](ctx context.Context, c *Client, method, path string, body any) (*T, error) {
	var out T
	if _, err := c.do(ctx, request{method: method, path: path, body: body}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
