// Package sshcmd is `gpuaasctl ssh` (a terminal or a command in a slice VM, through the
// controller's audited relay), `gpuaasctl ssh --stdio` (a raw stream to the guest's port 22
// for the user's own OpenSSH: ProxyCommand), `gpuaasctl ssh-config`, and `gpuaasctl
// sessions list|show|play`.
package sshcmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// Options are `ssh`'s dependencies and flags.
type Options struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Allocation string
	Command    []string
	Stdio      bool
	Console    bool
	ForceTTY   bool
}

// NewCmdSSH is `ssh ALLOC [-- command args]`.
func NewCmdSSH(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "ssh ALLOCATION [-- COMMAND ARGS...]",
		Short: "A terminal (or a command) in a slice VM through the controller's audited relay",
		Long: `Opens a session into an active allocation's VM. The controller authorizes it (the
allocation's tenant, or an admin, audited), the host daemon dials out to the controller and
SSHes into the guest with the host relay key, and the controller splices the two streams.

Without a command: an interactive terminal (raw mode, window size followed); the remote exit
status becomes gpuaasctl's. With a command: stdout, stderr and the exit status are the
command's; standard input is piped to it.

--stdio carries the guest's port 22 as raw bytes for your own OpenSSH and key:
  ssh -o ProxyCommand='gpuaasctl ssh --stdio %h' debian@ALLOCATION_ID
(gpuaasctl ssh-config prints a ready Host block.) --console attaches to the VM's serial
console instead (admins).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 {
				return cmdutil.FlagErrorf("missing ALLOCATION")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Allocation = args[0]
			if n := cmd.ArgsLenAtDash(); n >= 0 {
				if n != 1 {
					return cmdutil.FlagErrorf("one ALLOCATION before --, then the command")
				}
				opts.Command = args[1:]
			} else if len(args) > 1 {
				return cmdutil.FlagErrorf("put the command after --: gpuaasctl ssh %s -- %s", args[0], strings.Join(args[1:], " "))
			}
			if opts.Stdio && (len(opts.Command) > 0 || opts.Console) {
				return cmdutil.FlagErrorf("--stdio carries raw bytes: no command, no --console")
			}
			if runF != nil {
				return runF(opts)
			}
			return run(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVar(&opts.Stdio, "stdio", false, "raw stream to the guest's port 22 (for ssh -o ProxyCommand)")
	cmd.Flags().BoolVar(&opts.Console, "console", false, "the VM's serial console (admins)")
	cmd.Flags().BoolVarP(&opts.ForceTTY, "tty", "t", false, "request a terminal even with a command")
	return cmd
}

// exitError carries the remote exit status as gpuaasctl's.
func exitError(status int, msg string, stderr io.Writer) error {
	if msg != "" {
		fmt.Fprintf(stderr, "gpuaasctl ssh: %s\n", msg)
	}
	if status == 0 {
		return nil
	}
	return &cmdutil.SilentError{Code: status}
}

func run(ctx context.Context, o *Options) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	req := apiv1.TerminalRequest{Mode: terminal.ModeTerminal, Command: shellJoin(o.Command)}
	switch {
	case o.Stdio:
		req.Mode = terminal.ModeStdio
	case o.Console:
		req.Mode = terminal.ModeConsole
	}
	inFile, isFile := o.IO.In.(*os.File)
	interactive := req.Mode != terminal.ModeStdio && isFile && term.IsTerminal(int(inFile.Fd())) && (len(o.Command) == 0 || o.ForceTTY)
	if interactive {
		w, h, err := term.GetSize(int(inFile.Fd()))
		if err != nil || w <= 0 {
			w, h = 80, 24
		}
		req.Cols, req.Rows = w, h
	}
	if o.Allocation, err = cmdutil.AllocationID(ctx, c, o.Allocation); err != nil {
		return err
	}
	ticket, err := c.OpenTerminal(ctx, o.Allocation, req)
	if err != nil {
		return err
	}
	if ticket.Simulated {
		// Said on stderr so it never mixes with the command's output; the exit status below
		// is still the (simulated) remote one.
		fmt.Fprint(o.IO.ErrOut, "gpuaasctl ssh: simulated slice (sim runtime): no VM exists; a simulated guest answers\n")
	}
	conn, err := c.Attach(ctx, ticket)
	if err != nil {
		return err
	}
	defer conn.Close()
	if o.Stdio {
		return pipeRaw(ctx, conn, o.IO.In, o.IO.Out)
	}
	var restore func()
	if interactive {
		old, err := term.MakeRaw(int(inFile.Fd()))
		if err != nil {
			return err
		}
		var once sync.Once
		restore = func() { once.Do(func() { _ = term.Restore(int(inFile.Fd()), old) }) }
		defer restore()
		go forwardResize(ctx, conn, int(inFile.Fd()))
	}
	detach := -1
	var esc *escaper
	switch {
	case o.Console:
		detach = 0x1d // Ctrl-]: leave the console, as virsh console does
		fmt.Fprint(o.IO.ErrOut, "[gpuaasctl: Ctrl-] leaves the console]\r\n")
	case interactive:
		esc = &escaper{} // ~. leaves a terminal session, as in OpenSSH
	}
	status, msg, err := pumpFrames(ctx, conn, o.IO.In, o.IO.Out, o.IO.ErrOut, detach, esc)
	if restore != nil {
		restore() // before any message, so it prints on a sane terminal
	}
	if errors.Is(err, errDisconnected) {
		fmt.Fprintf(o.IO.ErrOut, "Connection to %s closed (~.).\n", o.Allocation)
		return &cmdutil.SilentError{Code: 255} // what OpenSSH returns for ~.
	}
	if err != nil {
		return err
	}
	return exitError(status, msg, o.IO.ErrOut)
}

var frameMu sync.Mutex

// errDisconnected ends a session the user left with the ~. escape.
var errDisconnected = errors.New("disconnected by the ~. escape")

func send(w io.Writer, typ byte, p []byte) error {
	frameMu.Lock()
	defer frameMu.Unlock()
	return terminal.WriteFrame(w, typ, p)
}

// forwardResize sends the window size on every SIGWINCH.
func forwardResize(ctx context.Context, conn net.Conn, fd int) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			if w, h, err := term.GetSize(fd); err == nil {
				if send(conn, terminal.FrameResize, terminal.Resize(w, h)) != nil {
					return
				}
			}
		}
	}
}

// pumpFrames copies stdin into data frames (then EOF), and the host's frames to stdout and
// stderr, until the exit frame. A connection that ends without one is an error.
func pumpFrames(ctx context.Context, conn net.Conn, in io.Reader, out, errOut io.Writer, detach int, esc *escaper) (int, string, error) {
	detached, disconnected := make(chan struct{}), make(chan struct{})
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := in.Read(buf)
			if detach >= 0 && n > 0 && bytes.IndexByte(buf[:n], byte(detach)) >= 0 {
				close(detached)
				_ = conn.Close()
				return
			}
			data := buf[:n]
			if esc != nil && n > 0 {
				var action escapeAction
				data, action = esc.filter(data)
				if action == escapeHelp {
					_, _ = io.WriteString(errOut, escapeHelpText)
				}
				if action == escapeDisconnect {
					if len(data) > 0 {
						_ = send(conn, terminal.FrameData, data)
					}
					close(disconnected)
					_ = conn.Close()
					return
				}
			}
			if len(data) > 0 {
				if send(conn, terminal.FrameData, data) != nil {
					return
				}
			}
			if err != nil {
				_ = send(conn, terminal.FrameEOF, nil)
				return
			}
		}
	}()
	go func() { <-ctx.Done(); _ = conn.Close() }() // Ctrl-C outside raw mode, or SIGTERM
	for {
		typ, p, err := terminal.ReadFrame(conn)
		if err != nil {
			select {
			case <-detached:
				return 0, "", nil
			case <-disconnected:
				return 0, "", errDisconnected
			default:
			}
			if ctx.Err() != nil {
				return 130, "interrupted", nil
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
				return 0, "", errors.New("the session ended without an exit status (relay or host closed it)")
			}
			return 0, "", err
		}
		switch typ {
		case terminal.FrameData:
			_, _ = out.Write(p)
		case terminal.FrameStderr:
			_, _ = errOut.Write(p)
		case terminal.FrameExit:
			st, msg, err := terminal.ParseExit(p)
			return st, msg, err
		}
	}
}

// pipeRaw carries bytes both ways until either side closes.
func pipeRaw(ctx context.Context, conn net.Conn, in io.Reader, out io.Writer) error {
	done := make(chan error, 2)
	go func() {
		_, err := io.Copy(conn, in)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- err
	}()
	go func() { _, err := io.Copy(out, conn); done <- err }()
	select {
	case <-ctx.Done():
		return nil
	case <-done:
		return nil
	}
}

// shellJoin quotes a command for the guest's shell (each argument single-quoted unless plain).
func shellJoin(args []string) string {
	parts := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) < 0 {
			parts[i] = a
			continue
		}
		parts[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(parts, " ")
}
