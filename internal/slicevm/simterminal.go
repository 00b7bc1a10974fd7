package slicevm

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// Terminal in the sim runtime: there is no VM to enter, so a simulated guest answers, enough
// to carry a session end to end through hostd's real relay stream (load and fault tests).
// Terminal mode echoes stdin back as stdout and, when stdin ends, exits with status N for the
// command "exit N" (else 0); stdio mode echoes raw bytes; there is no serial console.
func (Sim) Terminal(ctx context.Context, p *task.TerminalOpen, stream io.ReadWriteCloser) (out task.TerminalOutput, err error) {
	out = task.TerminalOutput{Mode: p.Mode}
	cs := &countingStream{ReadWriteCloser: stream}
	defer func() { out.BytesIn, out.BytesOut = cs.in, cs.out }()
	stop := context.AfterFunc(ctx, func() { _ = stream.Close() })
	defer stop()
	switch p.Mode {
	case terminal.ModeStdio:
		_, err = io.Copy(cs, cs)
		return out, err
	case terminal.ModeTerminal:
		status := 0
		if n, ok := strings.CutPrefix(p.Command, "exit "); ok {
			if v, err := strconv.Atoi(n); err == nil && v >= 0 && v <= 255 {
				status = v
			}
		}
		for {
			typ, b, err := terminal.ReadFrame(cs)
			if err != nil {
				return out, err // the client left before stdin ended
			}
			switch typ {
			case terminal.FrameData:
				if err := terminal.WriteFrame(cs, terminal.FrameData, b); err != nil {
					return out, err
				}
			case terminal.FrameEOF:
				out.ExitStatus = &status
				return out, terminal.WriteFrame(cs, terminal.FrameExit, terminal.Exit(status, ""))
			}
		}
	}
	return out, errors.New("the sim runtime runs no VM: no " + p.Mode + " to open")
}
