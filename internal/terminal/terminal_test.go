package terminal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestFrames(t *testing.T) {
	var b bytes.Buffer
	for _, f := range []struct {
		typ byte
		p   []byte
	}{{FrameData, []byte("hello")}, {FrameResize, Resize(120, 40)}, {FrameExit, Exit(-3, "killed")}, {FrameEOF, nil}} {
		if err := WriteFrame(&b, f.typ, f.p); err != nil {
			t.Fatal(err)
		}
	}
	typ, p, _ := ReadFrame(&b)
	if typ != FrameData || string(p) != "hello" {
		t.Fatalf("%d %q", typ, p)
	}
	_, p, _ = ReadFrame(&b)
	if c, r, err := ParseResize(p); err != nil || c != 120 || r != 40 {
		t.Fatalf("resize %d %d %v", c, r, err)
	}
	_, p, _ = ReadFrame(&b)
	if st, msg, err := ParseExit(p); err != nil || st != -3 || msg != "killed" {
		t.Fatalf("exit %d %q %v", st, msg, err)
	}
	if typ, p, err := ReadFrame(&b); typ != FrameEOF || len(p) != 0 || err != nil {
		t.Fatalf("eof frame %d %q %v", typ, p, err)
	}
	if _, _, err := ReadFrame(&b); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}
	if err := WriteFrame(&b, FrameData, make([]byte, MaxFrame+1)); err == nil {
		t.Fatal("oversized frame written")
	}
	huge := []byte{FrameData, 0xff, 0xff, 0xff, 0xff}
	if _, _, err := ReadFrame(bytes.NewReader(huge)); err == nil {
		t.Fatal("oversized frame read")
	}
	if _, _, err := ReadFrame(bytes.NewReader([]byte{FrameData, 0, 0, 0, 9, 'x'})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated frame: %v", err)
	}
	if _, _, err := ParseResize([]byte{1}); err == nil {
		t.Fatal("short resize accepted")
	}
}

func newHub(t *testing.T, idle time.Duration, rec string) (*Hub, chan Stats) {
	ch := make(chan Stats, 4)
	return &Hub{Idle: idle, RecordDir: rec, OnEnd: func(s Stats) { ch <- s }}, ch
}

func wait(t *testing.T, ch chan Stats) Stats {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the session never ended")
	}
	return Stats{}
}

func TestSpliceTerminalSession(t *testing.T) {
	dir := t.TempDir()
	h, ended := newHub(t, 0, dir)
	h.Expect("s1", "a1", ModeTerminal, 80, 24, time.Minute)
	cClient, cHub := net.Pipe()
	hHub, hHost := net.Pipe()
	go func() { _ = h.AttachClient("s1", cHub) }()
	go func() { _ = h.AttachHost("s1", hHub) }()
	for !isSpliced(h, "s1") {
		time.Sleep(time.Millisecond) // until both attached; bounded by the test timeout
	}
	// A second client for the same session is refused.
	x1, _ := net.Pipe()
	if err := h.AttachClient("s1", x1); !errors.Is(err, ErrNoSession) {
		t.Fatalf("second client attach: %v", err)
	}
	// client -> host: stdin
	go func() { _ = WriteFrame(cClient, FrameData, []byte("ls\n")) }()
	typ, p, err := ReadFrame(hHost)
	if err != nil || typ != FrameData || string(p) != "ls\n" {
		t.Fatalf("host got %d %q %v", typ, p, err)
	}
	// host -> client: output, then the exit status
	go func() {
		_ = WriteFrame(hHost, FrameData, []byte("file\r\n"))
		_ = WriteFrame(hHost, FrameExit, Exit(7, ""))
		hHost.Close()
	}()
	cr := bufio.NewReader(cClient)
	if typ, p, _ := ReadFrame(cr); typ != FrameData || string(p) != "file\r\n" {
		t.Fatalf("client got %d %q", typ, p)
	}
	if typ, p, _ := ReadFrame(cr); typ != FrameExit {
		t.Fatalf("client got %d %q", typ, p)
	}
	st := wait(t, ended)
	if st.ExitStatus == nil || *st.ExitStatus != 7 || st.Reason != "exited" || st.BytesIn != 8 || st.BytesOut != 11+9 {
		t.Fatalf("stats %+v (exit %v)", st, st.ExitStatus)
	}
	b, err := os.ReadFile(st.Recording)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(st.Recording)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var hdr map[string]any
	if fi.Mode().Perm() != 0o600 || len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &hdr) != nil || hdr["version"] != float64(2) || !strings.Contains(lines[1], `"o","file\r\n"`) {
		t.Fatalf("recording (%v):\n%s", fi.Mode().Perm(), b)
	}
	if h.Open("s1") {
		t.Fatal("an ended session is still open")
	}
}

func TestSpliceStdioIsRawAndUnrecorded(t *testing.T) {
	h, ended := newHub(t, 0, t.TempDir())
	h.Expect("s2", "a1", ModeStdio, 0, 0, time.Minute)
	cClient, cHub := net.Pipe()
	hHub, hHost := net.Pipe()
	go func() { _ = h.AttachHost("s2", hHub) }()
	go func() { _ = h.AttachClient("s2", cHub) }()
	go func() { _, _ = cClient.Write([]byte("SSH-2.0-OpenSSH\r\n")); cClient.Close() }()
	got, _ := io.ReadAll(hHost)
	if string(got) != "SSH-2.0-OpenSSH\r\n" {
		t.Fatalf("host got %q", got)
	}
	st := wait(t, ended)
	if st.Recording != "" || st.ExitStatus != nil || st.BytesIn != 17 || st.Reason != "client closed" {
		t.Fatalf("stats %+v", st)
	}
}

func TestSessionsEndOnReleaseIdleAndNoShow(t *testing.T) {
	// Released: every session of the allocation ends.
	h, ended := newHub(t, 0, "")
	h.Expect("r1", "alloc-r", ModeTerminal, 0, 0, time.Minute)
	a, b := net.Pipe()
	c, d := net.Pipe()
	go func() { _ = h.AttachClient("r1", b) }()
	go func() { _ = h.AttachHost("r1", c) }()
	told := make(chan string, 1)
	go func() { told <- exitMessage(a) }() // a live relay never closes a framed client bare
	go func() { _, _ = io.Copy(io.Discard, d) }()
	for h.Count() == 1 && !isSpliced(h, "r1") {
		time.Sleep(time.Millisecond) // until paired; bounded by the test timeout
	}
	if n := h.CloseAllocation("alloc-r"); n != 1 {
		t.Fatalf("closed %d sessions", n)
	}
	if st := wait(t, ended); st.Reason != "allocation released" {
		t.Fatalf("reason %q", st.Reason)
	}
	if m := <-told; m != "255 allocation released" {
		t.Fatalf("the client was told %q", m)
	}

	// Idle: no traffic either way ends it.
	h2, ended2 := newHub(t, 50*time.Millisecond, "")
	h2.Expect("i1", "a", ModeTerminal, 0, 0, time.Minute)
	a2, b2 := net.Pipe()
	c2, _ := net.Pipe()
	go func() { _ = h2.AttachClient("i1", b2) }()
	go func() { _ = h2.AttachHost("i1", c2) }()
	if m := exitMessage(a2); !strings.HasPrefix(m, "255 idle for") {
		t.Fatalf("the idle client was told %q", m)
	}
	if st := wait(t, ended2); !strings.HasPrefix(st.Reason, "idle for") {
		t.Fatalf("reason %q", st.Reason)
	}

	// Nobody came: the ticket lapses and the session is recorded as never attached.
	h3, ended3 := newHub(t, 0, "")
	h3.Expect("n1", "a", ModeTerminal, 0, 0, 10*time.Millisecond)
	if st := wait(t, ended3); st.Reason != "not attached in time" || h3.Open("n1") {
		t.Fatalf("reason %q", st.Reason)
	}

	// The host could not open it: a waiting client is told why.
	h4, ended4 := newHub(t, 0, "")
	h4.Expect("f1", "a", ModeTerminal, 0, 0, time.Minute)
	cl, hub := net.Pipe()
	go func() { _ = h4.AttachClient("f1", hub) }()
	for !isAttached(h4, "f1") {
		time.Sleep(time.Millisecond)
	}
	go h4.Fail("f1", "guest 10.100.0.10:22 unreachable")
	typ, p, err := ReadFrame(cl)
	st, msg, _ := ParseExit(p)
	if err != nil || typ != FrameExit || st != 255 || !strings.Contains(msg, "unreachable") {
		t.Fatalf("client got %d %d %q %v", typ, st, msg, err)
	}
	if s := wait(t, ended4); !strings.Contains(s.Reason, "unreachable") {
		t.Fatalf("reason %q", s.Reason)
	}
}

// exitMessage reads frames until the exit frame and returns "STATUS MESSAGE" ("" if the
// connection closed first).
func exitMessage(c net.Conn) string {
	for {
		typ, p, err := ReadFrame(c)
		if err != nil {
			return ""
		}
		if typ == FrameExit {
			st, msg, _ := ParseExit(p)
			return fmt.Sprint(st, " ", msg)
		}
	}
}

func isSpliced(h *Hub, id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[id]
	return ok && s.spliced
}

func isAttached(h *Hub, id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[id]
	return ok && s.client != nil
}

// CloseAll (shutdown) ends running and waiting sessions, tells framed clients why, and
// returns only once every session is recorded.
func TestCloseAllRecordsBeforeReturning(t *testing.T) {
	h, ended := newHub(t, 0, "")
	h.Expect("c1", "a", ModeTerminal, 0, 0, time.Minute)
	h.Expect("c2", "a", ModeStdio, 0, 0, time.Minute)
	client, hub := net.Pipe()
	hostHub, host := net.Pipe()
	go func() { _ = h.AttachClient("c1", hub) }()
	go func() { _ = h.AttachHost("c1", hostHub) }()
	go func() { _, _ = io.Copy(io.Discard, host) }()
	for !isSpliced(h, "c1") {
		time.Sleep(time.Millisecond) // until paired; bounded by the test timeout
	}
	told := make(chan string, 1)
	go func() { told <- exitMessage(client) }()
	if n := h.CloseAll("controller replica shutting down", 10*time.Second); n != 2 {
		t.Fatalf("closed %d sessions, want 2", n)
	}
	if len(ended) != 2 {
		t.Fatalf("%d sessions recorded when CloseAll returned, want 2", len(ended))
	}
	for i := 0; i < 2; i++ {
		if st := <-ended; st.Reason != "controller replica shutting down" {
			t.Fatalf("reason %q", st.Reason)
		}
	}
	if m := <-told; m != "255 controller replica shutting down" {
		t.Fatalf("the client was told %q", m)
	}
	if h.Count() != 0 {
		t.Fatalf("%d sessions left", h.Count())
	}
}
