package terminal

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
)

// UpgradeProtocol is the HTTP/1.1 Upgrade token of relay connections.
const UpgradeProtocol = "gpuaas-terminal/1"

// TokenHeader carries a session's single-use token (client or host).
const TokenHeader = "X-Gpuaas-Session-Token"

// BufferedConn is a connection whose first bytes were already read into r (by an HTTP
// reader before the upgrade): reads drain r first.
type BufferedConn struct {
	net.Conn
	R *bufio.Reader
}

func (c BufferedConn) Read(p []byte) (int, error) { return c.R.Read(p) }

// RefusedError is the controller answering an attach with something other than 101.
type RefusedError struct {
	Status string
	Code   int // the HTTP status code
	Body   []byte
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("relay refused: %s %s", e.Status, strings.TrimSpace(string(e.Body)))
}

// Dial opens an upgraded relay stream: TLS to base's host (HTTP/1.1 only, so the server can
// take the connection over), GET path with the headers and the Upgrade request. Anything but
// 101 is a *RefusedError carrying the response body.
func Dial(ctx context.Context, tlsCfg *tls.Config, base, path string, header http.Header) (net.Conn, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	cfg := tlsCfg.Clone()
	cfg.NextProtos = []string{"http/1.1"}
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "443")
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second}, Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequest(http.MethodGet, strings.TrimRight(base, "/")+path, nil)
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", UpgradeProtocol)
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
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		conn.Close()
		return nil, &RefusedError{Status: resp.Status, Code: resp.StatusCode, Body: body}
	}
	_ = conn.SetDeadline(time.Time{})
	return BufferedConn{conn, br}, nil
}
