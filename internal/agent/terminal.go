package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// dialRelay opens hostd's OUTBOUND stream for a terminal session: HTTPS with the node
// certificate, HTTP/1.1 Upgrade to the relay protocol, the session's host token.
func (a *Agent) dialRelay(ctx context.Context, p *task.TerminalOpen) (net.Conn, error) {
	if !strings.HasPrefix(p.AttachPath, "/api/v1/agent/terminal/") || strings.ContainsAny(p.AttachPath, "?#\r\n ") {
		return nil, fmt.Errorf("terminal: bad attach path %q", p.AttachPath)
	}
	tr, ok := a.hc.Load().Transport.(*http.Transport)
	if !ok {
		return nil, fmt.Errorf("terminal: unexpected transport")
	}
	h := http.Header{}
	h.Set(terminal.TokenHeader, p.HostToken)
	h.Set("User-Agent", "gpuaas-hostd/"+a.version)
	base, _ := a.srv.current()
	return terminal.Dial(ctx, tr.TLSClientConfig, base, p.AttachPath, h)
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
