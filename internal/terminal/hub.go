package terminal

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Stats is what the controller records when a session ends.
type Stats struct {
	SessionID    string
	AllocationID string
	Mode         string
	BytesIn      int64 // client -> guest
	BytesOut     int64 // guest -> client
	Started      time.Time
	Ended        time.Time
	ExitStatus   *int   // terminal/console mode, when the host reported one
	Reason       string // why it ended: exited, client closed, host closed, idle timeout, allocation released, not attached
	Recording    string // asciicast file, if recorded
}

// Hub pairs each session's client and host connections and splices them.
type Hub struct {
	// Idle ends a session with no traffic either way for this long (0: 30 minutes).
	Idle time.Duration
	// RecordDir, when set, keeps an asciicast v2 recording of terminal-mode output per session.
	RecordDir string
	// OnEnd is called once per session when it ends (persist, audit).
	OnEnd func(Stats)

	mu       sync.Mutex
	sessions map[string]*session
}

type session struct {
	id, alloc, mode string
	cols, rows      int
	client, host    net.Conn
	paired          chan struct{} // closed when both sides are attached
	done            chan struct{} // closed when the session ended
	recorded        chan struct{} // closed once OnEnd returned
	endOnce         sync.Once
	reason          string
	stats           Stats
	created         time.Time
	spliced         bool // set under Hub.mu when both sides attached
}

// ErrNoSession is an attach to a session that is not expected (unknown, ended, or taken).
var ErrNoSession = errors.New("no such terminal session waiting")

// Expect registers a session both sides will attach to within ttl.
func (h *Hub) Expect(id, alloc, mode string, cols, rows int, ttl time.Duration) {
	s := &session{id: id, alloc: alloc, mode: mode, cols: cols, rows: rows, paired: make(chan struct{}), done: make(chan struct{}), recorded: make(chan struct{}), created: time.Now().UTC()}
	h.mu.Lock()
	if h.sessions == nil {
		h.sessions = map[string]*session{}
	}
	h.sessions[id] = s
	h.mu.Unlock()
	go func() {
		select {
		case <-s.paired:
		case <-s.done:
		case <-time.After(ttl):
			h.end(s, "not attached in time")
		}
	}()
}

// Open reports whether a session is registered and not ended.
func (h *Hub) Open(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.sessions[id]
	return ok
}

// AttachClient attaches gpuaasctl's connection and blocks until the session ends.
func (h *Hub) AttachClient(id string, c net.Conn) error { return h.attach(id, c, true) }

// AttachHost attaches hostd's connection and blocks until the session ends.
func (h *Hub) AttachHost(id string, c net.Conn) error { return h.attach(id, c, false) }

func (h *Hub) attach(id string, c net.Conn, client bool) error {
	h.mu.Lock()
	s, ok := h.sessions[id]
	if ok && ((client && s.client != nil) || (!client && s.host != nil)) {
		ok = false // each side attaches once
	}
	if ok {
		if client {
			s.client = c
		} else {
			s.host = c
		}
	}
	both := ok && s.client != nil && s.host != nil
	if both {
		s.spliced = true
	}
	h.mu.Unlock()
	if !ok {
		return ErrNoSession
	}
	if both {
		close(s.paired)
		go h.splice(s)
	}
	<-s.done
	return nil
}

// Fail ends a session that cannot run, telling an attached terminal-mode client why (an exit
// frame with status 255 and the reason).
func (h *Hub) Fail(id, reason string) {
	h.mu.Lock()
	s, ok := h.sessions[id]
	h.mu.Unlock()
	if ok {
		h.end(s, reason)
	}
}

// CloseAllocation ends every session of an allocation (it started releasing).
func (h *Hub) CloseAllocation(alloc string) int {
	h.mu.Lock()
	var ss []*session
	for _, s := range h.sessions {
		if s.alloc == alloc {
			ss = append(ss, s)
		}
	}
	h.mu.Unlock()
	for _, s := range ss {
		h.end(s, "allocation released")
	}
	return len(ss)
}

// CloseAll ends every session (the controller is shutting down), telling framed clients why,
// and waits up to wait for the running ones to be recorded (OnEnd). It returns how many it
// ended.
func (h *Hub) CloseAll(reason string, wait time.Duration) int {
	h.mu.Lock()
	ss := make([]*session, 0, len(h.sessions))
	for _, s := range h.sessions {
		ss = append(ss, s)
	}
	h.mu.Unlock()
	for _, s := range ss {
		h.end(s, reason)
	}
	deadline := time.After(wait)
	for _, s := range ss {
		select {
		case <-s.recorded:
		case <-deadline:
			return len(ss)
		}
	}
	return len(ss)
}

// Count is the number of sessions registered or running.
func (h *Hub) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

// end ends a session once. A framed client that got no exit frame is told why with one
// (status 255, the reason): a client never sees a bare close from a live controller, so a
// bare close means the controller itself went away. A spliced session's client is told and
// closed by splice, once the host's bytes stopped flowing to it.
func (h *Hub) end(s *session, reason string) {
	s.endOnce.Do(func() {
		h.mu.Lock()
		delete(h.sessions, s.id)
		client, host, spliced := s.client, s.host, s.spliced
		h.mu.Unlock()
		s.reason = reason
		if host != nil {
			_ = host.Close()
		}
		if client != nil && !spliced {
			lastWord(client, s.mode, reason)
			_ = client.Close()
		}
		close(s.done)
		if !spliced {
			// Never ran: record why (splice records the sessions that ran).
			if h.OnEnd != nil {
				h.OnEnd(Stats{SessionID: s.id, AllocationID: s.alloc, Mode: s.mode, Started: s.created, Ended: time.Now().UTC(), Reason: reason})
			}
			close(s.recorded)
		}
	})
}

// lastWord sends a framed client the exit frame of a session ending without the guest's.
func lastWord(client net.Conn, mode, reason string) {
	if mode == ModeStdio {
		return // raw bytes of the guest's SSH: nothing may be added
	}
	_ = client.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = WriteFrame(client, FrameExit, Exit(255, reason))
}

// counter counts bytes and marks activity.
type counter struct {
	n    atomic.Int64
	last *atomic.Int64
}

func (c *counter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	c.last.Store(time.Now().UnixNano())
	return len(p), nil
}

func (h *Hub) splice(s *session) {
	idle := h.Idle
	if idle <= 0 {
		idle = 30 * time.Minute
	}
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	in, out := &counter{last: &last}, &counter{last: &last}
	s.stats = Stats{SessionID: s.id, AllocationID: s.alloc, Mode: s.mode, Started: time.Now().UTC()}
	var rec *recorder
	var parse *io.PipeWriter
	parsed := make(chan struct{})
	if s.mode != ModeStdio {
		// Read the host's frames on the side: the exit status, and the recording.
		if h.RecordDir != "" && s.mode == ModeTerminal {
			rec, _ = newRecorder(h.RecordDir, s)
		}
		pr, pw := io.Pipe()
		parse = pw
		go func() {
			defer close(parsed)
			for {
				typ, p, err := ReadFrame(pr)
				if err != nil {
					_, _ = io.Copy(io.Discard, pr)
					return
				}
				switch typ {
				case FrameData, FrameStderr:
					rec.output(p)
				case FrameExit:
					if st, _, err := ParseExit(p); err == nil {
						s.stats.ExitStatus = &st
					}
				}
			}
		}()
	} else {
		close(parsed)
	}
	reasons := make(chan string, 2)
	watch := &exitWatch{}
	hostDone := make(chan struct{})
	go func() {
		_, err := io.Copy(io.MultiWriter(s.host, in), s.client)
		reasons <- closeReason("client closed", err)
	}()
	go func() {
		defer close(hostDone)
		ws := []io.Writer{s.client, watch, out}
		if parse != nil {
			ws = append(ws, parse)
		}
		_, err := io.Copy(io.MultiWriter(ws...), s.host)
		reasons <- closeReason("host closed", err)
	}()
	tick := time.NewTicker(min(idle/4, time.Second))
	defer tick.Stop()
	var reason string
loop:
	for {
		select {
		case reason = <-reasons:
			break loop
		case <-s.done:
			reason = s.reason
			break loop
		case <-tick.C:
			if time.Since(time.Unix(0, last.Load())) > idle {
				reason = fmt.Sprintf("idle for %s", idle)
				break loop
			}
		}
	}
	h.end(s, reason) // closes the host: its copy to the client stops
	_ = s.client.SetWriteDeadline(time.Now().Add(5 * time.Second))
	<-hostDone
	if s.reason != "" {
		reason = s.reason
	}
	if !watch.sawExit() && !strings.HasPrefix(reason, "client closed") {
		lastWord(s.client, s.mode, reason)
	}
	_ = s.client.Close()
	if parse != nil {
		_ = parse.Close()
	}
	<-parsed
	if s.stats.ExitStatus != nil && (reason == "host closed" || reason == "client closed") {
		reason = "exited"
	}
	s.stats.BytesIn, s.stats.BytesOut, s.stats.Ended, s.stats.Reason = in.n.Load(), out.n.Load(), time.Now().UTC(), reason
	if rec != nil {
		s.stats.Recording = rec.close()
	}
	if h.OnEnd != nil {
		h.OnEnd(s.stats)
	}
	close(s.recorded)
}

func closeReason(who string, err error) string {
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return who + ": " + err.Error()
	}
	return who
}

// recorder writes asciicast v2: a header line, then [seconds, "o", text] per output chunk.
type recorder struct {
	mu    sync.Mutex
	f     *os.File
	start time.Time
	path  string
}

func newRecorder(dir string, s *session) (*recorder, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, s.id+".cast")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	r := &recorder{f: f, start: time.Now(), path: path}
	hdr, _ := json.Marshal(map[string]any{"version": 2, "width": max(s.cols, 80), "height": max(s.rows, 24), "timestamp": r.start.Unix(),
		"title": "gpuaas session " + s.id + " (allocation " + s.alloc + ")"})
	_, err = f.Write(append(hdr, '\n'))
	return r, err
}

func (r *recorder) output(p []byte) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ev, _ := json.Marshal([]any{float64(time.Since(r.start).Microseconds()) / 1e6, "o", string(p)})
	_, _ = r.f.Write(append(ev, '\n'))
}

func (r *recorder) close() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.f.Close()
	return r.path
}
