package slicevm

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// The sim runtime's guest: terminal mode echoes stdin and exits with N for "exit N" when
// stdin ends; stdio echoes raw bytes; console is refused.
func TestSimTerminalEchoGuest(t *testing.T) {
	ctx := context.Background()
	client, guest := net.Pipe()
	res := make(chan task.TerminalOutput, 1)
	go func() {
		out, _ := Sim{}.Terminal(ctx, &task.TerminalOpen{Mode: terminal.ModeTerminal, Command: "exit 9"}, guest)
		res <- out
	}()
	go func() {
		_ = terminal.WriteFrame(client, terminal.FrameResize, terminal.Resize(80, 24))
		_ = terminal.WriteFrame(client, terminal.FrameData, []byte("hi"))
		_ = terminal.WriteFrame(client, terminal.FrameEOF, nil)
	}()
	if typ, p, err := terminal.ReadFrame(client); err != nil || typ != terminal.FrameData || string(p) != "hi" {
		t.Fatalf("echo: %d %q %v", typ, p, err)
	}
	typ, p, err := terminal.ReadFrame(client)
	st, _, _ := terminal.ParseExit(p)
	if err != nil || typ != terminal.FrameExit || st != 9 {
		t.Fatalf("exit: %d %d %v", typ, st, err)
	}
	out := <-res
	if out.ExitStatus == nil || *out.ExitStatus != 9 || out.BytesIn != 9+7+5 || out.BytesOut != 7+9 {
		t.Fatalf("output %+v (exit %v)", out, out.ExitStatus)
	}

	client, guest = net.Pipe()
	go func() { _, _ = Sim{}.Terminal(ctx, &task.TerminalOpen{Mode: terminal.ModeStdio}, guest) }()
	go func() { _, _ = client.Write([]byte("SSH-2.0-x\r\n")) }()
	b := make([]byte, 11)
	if _, err := io.ReadFull(client, b); err != nil || string(b) != "SSH-2.0-x\r\n" {
		t.Fatalf("stdio echo %q %v", b, err)
	}
	client.Close()

	_, guest = net.Pipe()
	if _, err := (Sim{}).Terminal(ctx, &task.TerminalOpen{Mode: terminal.ModeConsole}, guest); err == nil {
		t.Fatal("the sim runtime opened a console")
	}
}
