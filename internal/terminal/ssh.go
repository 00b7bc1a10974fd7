package terminal

import (
	"errors"
	"io"
	"sync"

	"golang.org/x/crypto/ssh"
)

// FrameWriter writes each Write as frames of one type (split at MaxFrame); writers sharing
// Mu (stdout, stderr, exit) never interleave within a frame.
type FrameWriter struct {
	Mu   *sync.Mutex
	W    io.Writer
	Type byte
}

func (f FrameWriter) Write(p []byte) (int, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	for off := 0; off < len(p); off += MaxFrame {
		end := min(off+MaxFrame, len(p))
		if err := WriteFrame(f.W, f.Type, p[off:end]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// ServeSSH runs one guest session for a framed stream (hostd's side of terminal mode): a PTY
// of cols x rows when cols > 0, the command or a login shell; stdin, window changes and EOF
// come from the stream; stdout and stderr go back as frames; the exit status ends it. It
// returns the exit status (255 when the guest gave none).
func ServeSSH(stream io.ReadWriter, sess *ssh.Session, cols, rows int, command string) (int, error) {
	var mu sync.Mutex
	sess.Stdout = FrameWriter{&mu, stream, FrameData}
	sess.Stderr = FrameWriter{&mu, stream, FrameStderr}
	stdin, err := sess.StdinPipe()
	if err != nil {
		return 255, err
	}
	if cols > 0 {
		modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
		if err := sess.RequestPty("xterm-256color", max(rows, 1), cols, modes); err != nil {
			return 255, err
		}
	}
	if command != "" {
		err = sess.Start(command)
	} else {
		err = sess.Shell()
	}
	if err != nil {
		return 255, err
	}
	go func() {
		for {
			typ, p, err := ReadFrame(stream)
			if err != nil {
				_ = sess.Close() // the client is gone: end the remote side too
				return
			}
			switch typ {
			case FrameData:
				if _, err := stdin.Write(p); err != nil {
					return
				}
			case FrameEOF:
				_ = stdin.Close()
			case FrameResize:
				if c, r, err := ParseResize(p); err == nil {
					_ = sess.WindowChange(r, c)
				}
			}
		}
	}()
	status, msg := 0, ""
	if err := sess.Wait(); err != nil {
		var ee *ssh.ExitError
		var missing *ssh.ExitMissingError
		switch {
		case errors.As(err, &ee):
			status = ee.ExitStatus()
			if ee.Signal() != "" {
				msg = "killed by signal " + ee.Signal()
			}
		case errors.As(err, &missing):
			status, msg = 255, "the guest closed the session without an exit status"
		default:
			status, msg = 255, err.Error()
		}
	}
	mu.Lock()
	werr := WriteFrame(stream, FrameExit, Exit(status, msg))
	mu.Unlock()
	return status, werr
}
