package terminal

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// The exit watch finds an exit frame however the stream is cut into writes, and only a
// frame header's type byte counts (an exit type byte inside a payload does not).
func TestExitWatchAcrossWrites(t *testing.T) {
	var b bytes.Buffer
	_ = WriteFrame(&b, FrameData, []byte{FrameExit, FrameExit, 0, 0, 0, 9})
	_ = WriteFrame(&b, FrameStderr, []byte("err"))
	prefix := b.Len()
	_ = WriteFrame(&b, FrameExit, Exit(3, "bye"))
	for _, chunk := range []int{1, 2, 3, 7, b.Len()} {
		w := &exitWatch{}
		for p := b.Bytes()[:prefix]; len(p) > 0; p = p[min(chunk, len(p)):] {
			_, _ = w.Write(p[:min(chunk, len(p))])
		}
		if w.sawExit() {
			t.Fatalf("chunks of %d: an exit seen in data frames", chunk)
		}
		for p := b.Bytes()[prefix:]; len(p) > 0; p = p[min(chunk, len(p)):] {
			_, _ = w.Write(p[:min(chunk, len(p))])
		}
		if !w.sawExit() {
			t.Fatalf("chunks of %d: the exit frame was missed", chunk)
		}
	}
}

// relayPair runs Relay between a caller pipe and an owner pipe; it returns the test's ends
// and the relay's result.
func relayPair(lost func(io.Writer, RelayEnd)) (caller, owner net.Conn, done chan RelayEnd) {
	caller, callerRelay := net.Pipe()
	ownerRelay, owner := net.Pipe()
	done = make(chan RelayEnd, 1)
	go func() { done <- Relay(callerRelay, ownerRelay, lost) }()
	return caller, owner, done
}

func TestRelayCarriesBytesAndTellsALostOwner(t *testing.T) {
	// Bytes both ways; the owner then goes away without an exit frame: lost is called (and
	// told no exit passed), its last word reaches the caller, then the caller is closed.
	lostCalls := make(chan RelayEnd, 1)
	caller, owner, done := relayPair(func(w io.Writer, e RelayEnd) {
		lostCalls <- e
		_ = WriteFrame(w, FrameExit, Exit(255, "owner gone"))
	})
	go func() { _ = WriteFrame(caller, FrameData, []byte("in")) }()
	if typ, p, err := ReadFrame(owner); err != nil || typ != FrameData || string(p) != "in" {
		t.Fatalf("owner got %d %q %v", typ, p, err)
	}
	go func() { _ = WriteFrame(owner, FrameData, []byte("out")); owner.Close() }()
	if typ, p, err := ReadFrame(caller); err != nil || typ != FrameData || string(p) != "out" {
		t.Fatalf("caller got %d %q %v", typ, p, err)
	}
	if m := exitMessage(caller); m != "255 owner gone" {
		t.Fatalf("caller was told %q", m)
	}
	if _, err := caller.Read(make([]byte, 1)); err == nil {
		t.Fatal("the caller's connection is still open")
	}
	if e := <-done; !e.OwnerEnded || e.SawExit {
		t.Fatalf("relay end %+v", e)
	}
	if e := <-lostCalls; e.SawExit {
		t.Fatalf("lost told %+v", e)
	}

	// The owner sends the exit frame, then closes: lost learns an exit passed.
	caller, owner, done = relayPair(func(io.Writer, RelayEnd) {})
	go func() { _ = WriteFrame(owner, FrameExit, Exit(0, "")); owner.Close() }()
	if m := exitMessage(caller); m != "0 " {
		t.Fatalf("caller got %q", m)
	}
	if e := <-done; !e.OwnerEnded || !e.SawExit {
		t.Fatalf("relay end %+v", e)
	}

	// The caller leaves first: the owner's side is closed, lost is not called.
	caller, owner, done = relayPair(func(io.Writer, RelayEnd) { t.Error("lost called when the caller left") })
	caller.Close()
	if _, err := owner.Read(make([]byte, 1)); err == nil {
		t.Fatal("the owner's connection is still open")
	}
	if e := <-done; e.OwnerEnded {
		t.Fatalf("relay end %+v", e)
	}
}
