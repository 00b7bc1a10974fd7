// Package terminal is the SSH relay's wire and splice: gpuaasctl and hostd each hold an
// upgraded HTTPS connection to the controller (hostd's is outbound too: the controller never
// dials a host), and the controller splices the two byte streams of one session, counting
// bytes, enforcing an idle timeout, closing sessions when their allocation releases, and
// optionally recording terminal output as an asciicast v2 file.
//
// In terminal mode the bytes are frames (this file) carried end to end between gpuaasctl and
// hostd: stdin, stdout, stderr, window size and the exit status. In stdio mode they are the
// raw bytes of the guest's port 22, for the user's own OpenSSH client.
package terminal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame types.
const (
	FrameData   byte = 0 // client->host: stdin; host->client: stdout
	FrameStderr byte = 1 // host->client
	FrameResize byte = 2 // client->host: cols, rows (uint16 each)
	FrameExit   byte = 3 // host->client: exit status (int32), then an optional message
	FrameEOF    byte = 4 // client->host: stdin closed
)

// MaxFrame bounds one frame's payload.
const MaxFrame = 64 << 10

// Modes of a session.
const (
	ModeTerminal = "terminal" // SSH into the guest with the host relay key; framed
	ModeStdio    = "stdio"    // raw bytes to the guest's port 22
	ModeConsole  = "console"  // the VM's serial console through libvirt; framed (admin only)
)

// WriteFrame writes one frame: type, length (uint32), payload.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("terminal: frame of %d bytes exceeds %d", len(payload), MaxFrame)
	}
	hdr := [5]byte{typ}
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(append(hdr[:], payload...)); err != nil {
		return err
	}
	return nil
}

// ReadFrame reads one frame.
func ReadFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("terminal: frame of %d bytes exceeds %d", n, MaxFrame)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[0], p, nil
}

// Resize encodes a window size.
func Resize(cols, rows int) []byte {
	var b [4]byte
	binary.BigEndian.PutUint16(b[0:], uint16(min(max(cols, 1), 65535)))
	binary.BigEndian.PutUint16(b[2:], uint16(min(max(rows, 1), 65535)))
	return b[:]
}

// ParseResize decodes a window size.
func ParseResize(p []byte) (cols, rows int, err error) {
	if len(p) != 4 {
		return 0, 0, fmt.Errorf("terminal: resize frame of %d bytes", len(p))
	}
	return int(binary.BigEndian.Uint16(p[0:])), int(binary.BigEndian.Uint16(p[2:])), nil
}

// Exit encodes an exit status and message.
func Exit(status int, msg string) []byte {
	b := make([]byte, 4, 4+len(msg))
	binary.BigEndian.PutUint32(b, uint32(int32(status)))
	return append(b, msg...)
}

// ParseExit decodes an exit frame.
func ParseExit(p []byte) (int, string, error) {
	if len(p) < 4 {
		return 0, "", fmt.Errorf("terminal: exit frame of %d bytes", len(p))
	}
	return int(int32(binary.BigEndian.Uint32(p))), string(p[4:]), nil
}
