package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/terminal"
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Server()+"/api/v1/sessions/"+esc(id)+"/recording", nil)
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

// Attach connects to a ticket's session: HTTPS (HTTP/1.1) with the caller's token and the
// ticket's single-use token, upgraded to a raw byte stream.
func (c *Client) Attach(ctx context.Context, t *apiv1.TerminalTicket) (net.Conn, error) {
	tr, ok := c.hc.Transport.(*http.Transport)
	if !ok || tr.TLSClientConfig == nil {
		return nil, errors.New("client: terminal attach needs the default HTTPS transport")
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.token)
	h.Set("User-Agent", c.ua)
	h.Set(terminal.TokenHeader, t.Token)
	conn, err := terminal.Dial(ctx, tr.TLSClientConfig, c.Server(), t.AttachPath, h)
	var refused *terminal.RefusedError
	switch {
	case errors.As(err, &refused):
		var e apiv1.Error
		if json.Unmarshal(refused.Body, &e) == nil && e.Code != "" {
			return nil, &e
		}
		return nil, err
	case err != nil:
		return nil, &NetworkError{URL: c.Server(), Err: err}
	}
	return conn, nil
}
