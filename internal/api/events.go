package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// maxEventWait bounds ?wait= of GET /api/v1/events, like the hosts' task poll.
const maxEventWait = 60 * time.Second

// eventHeadEvery is how often a replica with waiting event polls reads the log's head. Most
// events are appended by triggers inside transactions of the create, dispatch and release
// paths, where a NOTIFY would cost them (NOTIFY in the reserve transaction costs ~45% of its
// throughput), and an event becomes readable only when every older writing transaction has
// ended, which nothing announces; one indexed read per interval per replica, and only while
// someone waits, covers both. Events appended from Go code are announced at once on
// store.EventsChannel.
const eventHeadEvery = 200 * time.Millisecond

// eventWaiters wakes this replica's event long polls: every waiter holds the current
// broadcast channel, which is closed (and replaced) when the log's head moves or a
// notification arrives.
type eventWaiters struct {
	st      *store.Store
	mu      sync.Mutex
	ch      chan struct{}
	waiting int
	watch   bool // the head watcher runs
}

// subscribe returns the channel closed at the next wake-up, and the func to call when the
// caller stops waiting. The first waiter starts the head watcher; it ends with the last.
func (e *eventWaiters) subscribe() (<-chan struct{}, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch == nil {
		e.ch = make(chan struct{})
	}
	e.waiting++
	if !e.watch {
		e.watch = true
		go e.watchHead()
	}
	var once sync.Once
	return e.ch, func() {
		once.Do(func() {
			e.mu.Lock()
			e.waiting--
			e.mu.Unlock()
		})
	}
}

// wake releases every current waiter.
func (e *eventWaiters) wake() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch != nil {
		close(e.ch)
		e.ch = nil
	}
}

func (e *eventWaiters) watchHead() {
	var last store.EventCursor
	first := true
	t := time.NewTicker(eventHeadEvery)
	defer t.Stop()
	for {
		e.mu.Lock()
		if e.waiting == 0 {
			e.watch = false
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		head, err := e.st.EventHead(ctx)
		cancel()
		// The first read wakes too: an event may have become readable between a waiter's own
		// read and this one, and the head it now shows would never change again for it.
		if err == nil && (first || head != last) {
			e.wake()
			last, first = head, false
		}
		<-t.C
	}
}

var eventQuery = []string{"after", "since", "limit", "wait"}

// listEvents is GET /api/v1/events: the caller's events after a cursor (tenants: their own,
// without host identities), waiting up to ?wait= for the first one.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, p Principal) error {
	q := r.URL.Query()
	after, err := store.ParseEventCursor(q.Get("after"))
	if err != nil {
		return errInvalid("after is not a cursor this API gave (pass a previous answer's next_cursor)")
	}
	f := store.EventFilter{After: after}
	if !p.IsAdmin() {
		f.TenantID = p.TenantID
	}
	if v := q.Get("since"); v != "" {
		if f.Since, err = parseSince(v, time.Now()); err != nil {
			return err
		}
	}
	limit, _, err := queryInt(r, "limit", 1, 1000)
	if err != nil {
		return err
	}
	f.Limit = limit
	wait, err := queryDuration(r, "wait", 0, maxEventWait)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for {
		woken, done := s.events.subscribe()
		evs, next, err := s.store.ReadEvents(r.Context(), f)
		if err != nil {
			done()
			return err
		}
		left := time.Until(deadline)
		if len(evs) > 0 || left <= 0 {
			done()
			writeJSON(w, http.StatusOK, presentEvents(evs, next, p.IsAdmin()))
			return nil
		}
		t := time.NewTimer(left)
		select {
		case <-woken:
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
		done()
		if r.Context().Err() != nil {
			return nil // the client went away
		}
	}
}

// parseSince reads ?since=: an RFC 3339 time, or a duration meaning that long ago.
func parseSince(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, errInvalid("since must be an RFC 3339 time (2026-01-02T15:04:05Z) or a duration such as 1h")
}

func presentEvents(evs []store.Event, next store.EventCursor, admin bool) apiv1.EventPage {
	out := apiv1.EventPage{Events: make([]apiv1.Event, 0, len(evs)), NextCursor: next.String()}
	for _, e := range evs {
		out.Events = append(out.Events, presentEvent(e, admin))
	}
	return out
}

func presentEvent(e store.Event, admin bool) apiv1.Event {
	ev := apiv1.Event{Cursor: e.Cursor.String(), Type: e.Type, AllocationID: e.AllocationID, Data: e.Data, CreatedAt: e.CreatedAt}
	if admin {
		ev.TenantID, ev.NodeID = e.TenantID, e.NodeID
	}
	return ev
}

// notifyEvents wakes event polls on every replica after a commit that appended events from
// Go code (a failure only delays them to the head watchers' next read).
func (s *Server) notifyEvents(ctx context.Context) {
	s.events.wake()
	if err := s.store.NotifyEvents(ctx); err != nil && !errors.Is(err, context.Canceled) {
		s.log.Warn("event notification", "err", err)
	}
}
