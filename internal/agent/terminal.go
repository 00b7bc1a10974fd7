package agent

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// relayConn is the upgraded connection, reading first what the response reader buffered.
type relayConn struct {
	net.Conn
	r *bufio.Reader
}

func (c relayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// dialRelay opens hostd's OUTBOUND stream for a terminal session: HTTPS with the node
// certificate, HTTP/1.1 Upgrade to the relay protocol, the session's host token.
func (a *Agent) dialRelay(ctx context.Context, p *task.TerminalOpen) (net.Conn, error) {
	if !strings.HasPrefix(p.AttachPath, "/api/v1/agent/terminal/") || strings.ContainsAny(p.AttachPath, "?#\r\n ") {
		return nil, fmt.Errorf("terminal: bad attach path %q", p.AttachPath)
	}
	u, err := url.Parse(a.base)
	if err != nil {
		return nil, err
	}
	tr, ok := a.hc.Transport.(*http.Transport)
	if !ok {
		return nil, fmt.Errorf("terminal: unexpected transport")
	}
	cfg := tr.TLSClientConfig.Clone()
	cfg.NextProtos = []string{"http/1.1"} // the relay hijacks an HTTP/1.1 connection
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "443")
	}
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second}, Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequest(http.MethodGet, a.base+p.AttachPath, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "gpuaas-terminal/1")
	req.Header.Set("X-Gpuaas-Session-Token", p.HostToken)
	req.Header.Set("User-Agent", "gpuaas-hostd/"+a.version)
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		conn.Close()
		return nil, fmt.Errorf("relay refused the host: %s %s", resp.Status, strings.TrimSpace(string(body)))
	}
	_ = conn.SetDeadline(time.Time{})
	return relayConn{conn, br}, nil
}

// terminalOpen runs a terminal.open task: the outbound relay stream, then the runtime's session.
func (a *Agent) terminalOpen(ctx context.Context, p *task.TerminalOpen) (task.TerminalOutput, error) {
	t, ok := a.runtime.(slicevm.Terminaler)
	if !ok {
		return task.TerminalOutput{Mode: p.Mode}, fmt.Errorf("runtime %s has no terminals", a.runtime.Name())
	}
	conn, err := a.dialRelay(ctx, p)
	if err != nil {
		return task.TerminalOutput{Mode: p.Mode}, fmt.Errorf("relay: %w", err)
	}
	defer conn.Close()
	out, err := t.Terminal(ctx, p, conn)
	if err != nil && out.ExitStatus == nil && p.Mode != terminal.ModeStdio {
		// The client is attached and waiting: tell it why, in its own framing.
		_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = terminal.WriteFrame(conn, terminal.FrameExit, terminal.Exit(255, "the host could not open the session: "+err.Error()))
	}
	return out, err
}
