package slicevm

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// Terminaler is a runtime that can open a session into a slice VM (terminal.open).
type Terminaler interface {
	Terminal(ctx context.Context, p *task.TerminalOpen, stream io.ReadWriteCloser) (task.TerminalOutput, error)
}

var loginRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// countingStream counts bytes each way on hostd's side of a session.
type countingStream struct {
	io.ReadWriteCloser
	in, out int64
	mu      sync.Mutex
}

func (c *countingStream) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	c.mu.Lock()
	c.in += int64(n)
	c.mu.Unlock()
	return n, err
}

func (c *countingStream) Write(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Write(p)
	c.mu.Lock()
	c.out += int64(n)
	c.mu.Unlock()
	return n, err
}

// Terminal serves one relay session on stream (hostd's outbound connection to the
// controller): terminal mode SSHes into the guest as the image's user with the host relay
// key, checking the guest host key pinned at readiness; stdio mode is the guest's port 22 as
// raw bytes. The session ends when either side closes.
func (h *Host) Terminal(ctx context.Context, p *task.TerminalOpen, stream io.ReadWriteCloser) (out task.TerminalOutput, err error) {
	out = task.TerminalOutput{Mode: p.Mode}
	cs := &countingStream{ReadWriteCloser: stream}
	defer func() { out.BytesIn, out.BytesOut = cs.in, cs.out }()
	ip := net.ParseIP(p.GuestIP)
	if ip == nil || !loginRE.MatchString(p.Username) {
		return out, fmt.Errorf("terminal: bad guest address %q or user %q", p.GuestIP, p.Username)
	}
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(h.cfg.GuestSSHPort))
	switch p.Mode {
	case terminal.ModeStdio:
		d := net.Dialer{Timeout: 10 * time.Second}
		g, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return out, fmt.Errorf("guest %s unreachable: %w", addr, err)
		}
		defer g.Close()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(g, cs); done <- struct{}{} }()
		go func() { _, _ = io.Copy(cs, g); done <- struct{}{} }()
		select {
		case <-done:
		case <-ctx.Done():
		}
		return out, nil
	case terminal.ModeTerminal:
		pin := filepath.Join(h.SliceDir(p.AllocationID), "guest_host_key")
		if _, err := os.Stat(pin); err != nil {
			return out, fmt.Errorf("the guest's host key was never pinned (%s): refusing to trust an unknown guest", pin)
		}
		signer, _, err := EnsureTerminalKey(h.cfg.TerminalKeyPath)
		if err != nil {
			return out, err
		}
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		cl, err := dialGuest(dctx, addr, p.Username, signer, pin)
		cancel()
		if err != nil {
			return out, fmt.Errorf("ssh to the guest %s: %w", addr, err)
		}
		defer cl.Close()
		sess, err := cl.NewSession()
		if err != nil {
			return out, err
		}
		defer sess.Close()
		go func() { <-ctx.Done(); _ = cl.Close() }()
		status, err := terminal.ServeSSH(cs, sess, p.Cols, p.Rows, p.Command)
		out.ExitStatus = &status
		return out, err
	case terminal.ModeConsole:
		return out, h.console(ctx, p, cs)
	}
	return out, fmt.Errorf("terminal: unknown mode %q", p.Mode)
}

// console streams the VM's serial console (read-only: go-libvirt's console stream carries
// output only) as data frames until the client leaves or the console closes.
func (h *Host) console(ctx context.Context, p *task.TerminalOpen, stream io.ReadWriter) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	out := terminal.FrameWriter{Mu: &mu, W: stream, Type: terminal.FrameData}
	notice := terminal.FrameWriter{Mu: &mu, W: stream, Type: terminal.FrameStderr}
	go func() {
		told := false
		for {
			typ, _, err := terminal.ReadFrame(stream)
			if err != nil {
				cancel() // the client left
				return
			}
			if typ == terminal.FrameData && !told {
				told = true
				_, _ = io.WriteString(notice, "\r\n[gpuaas: the serial console is read-only through this relay]\r\n")
			}
		}
	}()
	_, _ = io.WriteString(notice, "[gpuaas: serial console of "+VMName(p.AllocationID)+"; output only, Ctrl-C or closing ends it]\r\n")
	err := hypervisor.Console(ctx, h.cfg.LibvirtSocket, VMName(p.AllocationID), out)
	msg, status := "console closed", 0
	if err != nil {
		msg, status = err.Error(), 1
	}
	_, _ = terminal.FrameWriter{Mu: &mu, W: stream, Type: terminal.FrameExit}.Write(terminal.Exit(status, msg))
	return err
}
