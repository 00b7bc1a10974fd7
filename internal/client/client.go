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
	"net/http"
	"net/url"
	"strings"
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

// Client talks to one controller. It is safe for concurrent use.
type Client struct {
	base    *url.URL
	token   string
	hc      *http.Client
	ua      string
	maxBody int64
}

// New validates the options and builds a client. It does not contact the server.
func New(o Options) (*Client, error) {
	u, err := parseServer(o.Server)
	if err != nil {
		return nil, err
	}
	hc := o.HTTPClient
	if hc == nil {
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.CAFile != "" {
			if tlsCfg, err = pki.ClientTLSConfig(o.CAFile); err != nil {
				return nil, err
			}
		}
		hc = &http.Client{
			Timeout:   60 * time.Second,
			Transport: &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true},
		}
	}
	ua := o.UserAgent
	if ua == "" {
		ua = "gpuaas-client"
	}
	return &Client{base: u, token: o.Token, hc: hc, ua: ua, maxBody: MaxResponseBytes}, nil
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

// Server is the controller's base URL.
func (c *Client) Server() string { return c.base.String() }

// request describes one API call.
type request struct {
	method string
	path   string // below the server's base URL, e.g. /api/v1/whoami
	query  url.Values
	header http.Header
	body   any // JSON-encoded when not nil
}

// do performs r and decodes a 2xx body into out (when not nil). It returns the HTTP status.
func (c *Client) do(ctx context.Context, r request, out any) (int, error) {
	var rd io.Reader
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return 0, fmt.Errorf("encoding %s %s request: %w", r.method, r.path, err)
		}
		rd = bytes.NewReader(b)
	}
	// r.path is already escaped (ids go through esc): keep it as RawPath so a "/" or "%" in
	// a node name reaches the server as data, not as a path separator.
	u := *c.base
	var err error
	u.RawPath = c.base.EscapedPath() + r.path
	if u.Path, err = url.PathUnescape(u.RawPath); err != nil {
		return 0, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	u.RawQuery = r.query.Encode()
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), rd)
	if err != nil {
		return 0, err
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
			return 0, ctx.Err() // the caller gave up; the controller may be fine
		}
		return 0, &NetworkError{URL: c.Server(), Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err != nil {
		if ctx.Err() != nil {
			return resp.StatusCode, ctx.Err()
		}
		return resp.StatusCode, &NetworkError{URL: c.Server(), Err: fmt.Errorf("reading response: %w", err)}
	}
	if int64(len(data)) > c.maxBody {
		return resp.StatusCode, fmt.Errorf("%s %s: response exceeds %d bytes", r.method, r.path, c.maxBody)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, decodeError(resp, data)
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decoding %s %s response: %w", r.method, r.path, err)
		}
	}
	return resp.StatusCode, nil
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
