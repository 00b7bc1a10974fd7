package terminal

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// exitWatch follows a framed byte stream as it passes and notes whether an exit frame went by
// (it never holds the bytes, only the current frame's header).
type exitWatch struct {
	mu   sync.Mutex
	hdr  [5]byte
	nh   int
	left uint32
	seen bool
}

func (w *exitWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		if w.left > 0 {
			k := min(uint32(len(p)), w.left)
			p, w.left = p[k:], w.left-k
			continue
		}
		k := copy(w.hdr[w.nh:], p)
		p, w.nh = p[k:], w.nh+k
		if w.nh == len(w.hdr) {
			w.nh, w.left = 0, binary.BigEndian.Uint32(w.hdr[1:])
			if w.hdr[0] == FrameExit {
				w.seen = true
			}
		}
	}
	return n, nil
}

func (w *exitWatch) sawExit() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// RelayEnd says how a relayed session ended.
type RelayEnd struct {
	// OwnerEnded: the owning replica's side ended first (else the caller's did).
	OwnerEnded bool
	// SawExit: an exit frame passed from the owner to the caller (framed client sides only).
	SawExit bool
	// Err is the error that ended the first side to end (nil for a clean close).
	Err error
}

// Relay carries one end of a session (a client's or a host's connection, caller) to the
// replica that splices it (owner), byte for byte, until either side ends; then it closes both.
// The owner's hub counts, records and audits the session: the relay only carries it.
//
// lost is called when the owner's side ended before the caller's; it may write a last word to
// the caller (a framed client's exit frame) before the caller's connection closes, and is
// told whether an exit frame already passed.
func Relay(caller, owner net.Conn, lost func(w io.Writer, e RelayEnd)) RelayEnd {
	watch := &exitWatch{}
	type result struct {
		owner bool
		err   error
	}
	done := make(chan result, 2)
	toCaller := make(chan struct{})
	go func() {
		_, err := io.Copy(owner, caller)
		done <- result{false, err}
	}()
	go func() {
		defer close(toCaller)
		_, err := io.Copy(io.MultiWriter(caller, watch), owner)
		done <- result{true, err}
	}()
	first := <-done
	end := RelayEnd{OwnerEnded: first.owner, Err: first.err}
	if errors.Is(end.Err, net.ErrClosed) {
		end.Err = nil
	}
	_ = owner.Close() // ends the owner->caller copy; nothing more goes to the caller
	<-toCaller
	end.SawExit = watch.sawExit()
	if end.OwnerEnded && lost != nil {
		_ = caller.SetWriteDeadline(time.Now().Add(5 * time.Second))
		lost(caller, end)
	}
	_ = caller.Close()
	return end
}
