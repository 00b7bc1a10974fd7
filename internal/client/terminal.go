package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// OpenTerminal asks for a session into an allocation's VM and returns its single-use ticket.
func (c *Client) OpenTerminal(ctx context.Context, allocation string, req apiv1.TerminalRequest) (*apiv1.TerminalTicket, error) {
	return send[apiv1.TerminalTicket](ctx, c, http.MethodPost, "/api/v1/allocations/"+esc(allocation)+"/terminal", req)
}

// ListSessions lists terminal sessions (tenants: their own).
func (c *Client) ListSessions(ctx context.Context, allocation string) ([]apiv1.TerminalSession, error) {
	v := map[string][]string{}
	if allocation != "" {
		v["allocation"] = []string{allocation}
	}
	return list[apiv1.TerminalSession](ctx, c, "/api/v1/sessions", v)
}

// GetSession returns one terminal session.
func (c *Client) GetSession(ctx context.Context, id string) (*apiv1.TerminalSession, error) {
	return get[apiv1.TerminalSession](ctx, c, "/api/v1/sessions/"+esc(id), nil)
}

// Recording returns a session's asciicast v2 recording.
func (c *Client) Recording(ctx context.Context, id string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base.String()+"/api/v1/sessions/"+esc(id)+"/recording", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("User-Agent", c.ua)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, &NetworkError{URL: c.Server(), Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e apiv1.Error
		if json.Unmarshal(b, &e) == nil && e.Code != "" {
			return nil, &e
		}
		return nil, fmt.Errorf("recording: %s", resp.Status)
	}
	return b, nil
}

// upgradedConn reads first what the response reader buffered.
type upgradedConn struct {
	net.Conn
	r *bufio.Reader
}

func (u upgradedConn) Read(p []byte) (int, error) { return u.r.Read(p) }

// Attach connects to a ticket's session: HTTPS (HTTP/1.1) with the caller's token and the
// ticket's single-use token, upgraded to a raw byte stream.
func (c *Client) Attach(ctx context.Context, t *apiv1.TerminalTicket) (net.Conn, error) {
	tr, ok := c.hc.Transport.(*http.Transport)
	if !ok || tr.TLSClientConfig == nil {
		return nil, errors.New("client: terminal attach needs the default HTTPS transport")
	}
	cfg := tr.TLSClientConfig.Clone()
	cfg.NextProtos = []string{"http/1.1"}
	if cfg.ServerName == "" {
		cfg.ServerName = c.base.Hostname()
	}
	host := c.base.Host
	if c.base.Port() == "" {
		host = net.JoinHostPort(c.base.Hostname(), "443")
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second}, Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, &NetworkError{URL: c.Server(), Err: err}
	}
	req, _ := http.NewRequest(http.MethodGet, c.base.String()+t.AttachPath, nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("User-Agent", c.ua)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "gpuaas-terminal/1")
	req.Header.Set("X-Gpuaas-Session-Token", t.Token)
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, &NetworkError{URL: c.Server(), Err: err}
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, &NetworkError{URL: c.Server(), Err: err}
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		conn.Close()
		var e apiv1.Error
		if json.Unmarshal(b, &e) == nil && e.Code != "" {
			return nil, &e
		}
		return nil, fmt.Errorf("attach: %s %s", resp.Status, strings.TrimSpace(string(b)))
	}
	_ = conn.SetDeadline(time.Time{})
	return upgradedConn{conn, br}, nil
}
