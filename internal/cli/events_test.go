package cli

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// events -w follows the log page by page, each request resuming at the previous answer's
// cursor with a long poll, and prints one JSON event per line; an error ends it with its exit
// status.
func TestEventsWatchFollowsTheCursor(t *testing.T) {
	t.Parallel()
	ev := func(cursor, typ string) apiv1.Event {
		return apiv1.Event{Cursor: cursor, Type: typ, AllocationID: "0c989b43-1027-4099-a9e1-70c9acad3fff",
			Data: json.RawMessage(`{"status":"active","previous_status":"provisioning"}`), CreatedAt: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)}
	}
	pages := map[string]apiv1.EventPage{
		"":    {Events: []apiv1.Event{ev("5-1", "allocation.requested"), ev("5-2", "allocation.provisioning")}, NextCursor: "5-2"},
		"5-2": {Events: []apiv1.Event{ev("7-3", "allocation.active")}, NextCursor: "7-3"},
	}
	fa := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/events": func(w http.ResponseWriter, r *http.Request) {
		if p, ok := pages[r.URL.Query().Get("after")]; ok {
			reply(200, p)(w, r)
			return
		}
		reply(401, apiv1.Error{Code: apiv1.CodeUnauthorized, Message: "token revoked"})(w, r)
	}})
	r := run(t, fa.env(t), "events", "-w", "-o", "json")
	if r.Code != 3 || !strings.Contains(r.ErrOut, "token revoked") {
		t.Fatalf("exit %d: %s", r.Code, r.ErrOut)
	}
	lines := strings.Split(strings.TrimSpace(r.Out), "\n")
	if len(lines) != 3 {
		t.Fatalf("output:\n%s", r.Out)
	}
	for i, want := range []string{"allocation.requested", "allocation.provisioning", "allocation.active"} {
		var e apiv1.Event
		if err := json.Unmarshal([]byte(lines[i]), &e); err != nil || e.Type != want {
			t.Fatalf("line %d %q: %v", i, lines[i], err)
		}
	}
	var afters []string
	for _, req := range fa.requests() {
		q, _ := url.ParseQuery(req.Query)
		if q.Get("wait") != "30s" {
			t.Fatalf("a follow request without a long poll: %s", req.Query)
		}
		afters = append(afters, q.Get("after"))
	}
	if strings.Join(afters, ",") != ",5-2,7-3" {
		t.Fatalf("cursors sent: %q", afters)
	}
}

func TestEventsOnceAndFlags(t *testing.T) {
	t.Parallel()
	page := apiv1.EventPage{Events: []apiv1.Event{{Cursor: "5-1", Type: "maintenance.scheduled", AllocationID: "0c989b43-1027-4099-a9e1-70c9acad3fff",
		Data: json.RawMessage(`{"deadline":"2026-03-02T10:00:00Z","reason":"firmware"}`), CreatedAt: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)}}, NextCursor: "5-1"}
	fa := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/events": reply(200, page)})
	r := run(t, fa.env(t), "events", "--since", "1h")
	if r.Code != 0 || !strings.Contains(r.Out, "maintenance by 2026-03-02T10:00:00Z: firmware") {
		t.Fatalf("exit %d: %s %s", r.Code, r.Out, r.ErrOut)
	}
	if q := fa.last(t).Query; !strings.Contains(q, "since=1h") || strings.Contains(q, "wait") {
		t.Fatalf("query %s", q)
	}
	if r := run(t, fa.env(t), "events", "--since", "1h", "--after", "5-1"); r.Code != 2 {
		t.Fatalf("--since with --after: exit %d", r.Code)
	}
	if r := run(t, fa.env(t), "nodes", "drain", "n1", "--reason", "x"); r.Code != 2 || !strings.Contains(r.ErrOut, "go together") {
		t.Fatalf("drain --reason alone: exit %d %s", r.Code, r.ErrOut)
	}
	if r := run(t, fa.env(t), "webhooks", "delete", "abc"); r.Code != 2 || !strings.Contains(r.ErrOut, "--yes") {
		t.Fatalf("webhooks delete without --yes: exit %d %s", r.Code, r.ErrOut)
	}
}
