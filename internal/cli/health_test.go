package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

// `health` lists nodes in the order the controller ranks them (worst first) with their drain
// reasons; `slots quarantine|clear` need a reason and send it; `alloc release --report` sends
// the report.
func TestHealthCommands(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	fleet := apiv1.List[apiv1.NodeHealth]{Items: []apiv1.NodeHealth{
		{Node: "h200-02", Status: "active", Draining: true, DrainReason: "4 of 8 slots quarantined", Slots: 8, Healthy: 4, Quarantined: 4, LastEventAt: &at, LastEvent: "xid 79"},
		{Node: "h200-01", Status: "active", Slots: 8, Healthy: 8}}}
	ev := apiv1.HealthEvent{HealthBefore: "healthy", HealthAfter: "quarantined", Reason: "riser"}
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/admin/health":                                              reply(200, fleet),
		"POST /api/v1/admin/nodes/h200-01/slots/3/quarantine":                   reply(200, ev),
		"POST /api/v1/admin/nodes/h200-01/slots/3/clear":                        reply(409, apiv1.Error{Code: apiv1.CodeConflict, Message: "slot 3 is quarantined and has no passed validation"}),
		"POST /api/v1/allocations/0190aaaa-0000-7000-8000-000000000001/release": reply(200, apiv1.Allocation{ID: "0190aaaa-0000-7000-8000-000000000001", Status: "releasing"}),
	})
	r := run(t, fa.env(t), "health")
	lines := strings.Split(strings.TrimSpace(r.Out), "\n")
	if r.Code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "h200-02") || !strings.Contains(lines[1], "yes (4 of 8 slots quarantined)") {
		t.Fatalf("health: %d\n%s", r.Code, r.Out)
	}
	before := len(fa.requests())
	if r = run(t, fa.env(t), "slots", "quarantine", "h200-01", "3"); r.Code != cmdutil.ExitUsage || !strings.Contains(r.ErrOut, "--reason is required") || len(fa.requests()) != before {
		t.Fatalf("quarantine without a reason: %d %q", r.Code, r.ErrOut)
	}
	if r = run(t, fa.env(t), "slots", "quarantine", "h200-01", "3", "--reason", "riser"); r.Code != 0 || !strings.Contains(r.Out, "healthy -> quarantined") {
		t.Fatalf("quarantine: %d %q %q", r.Code, r.Out, r.ErrOut)
	}
	var sent apiv1.SlotHealthChange
	if json.Unmarshal(fa.last(t).Body, &sent) != nil || sent.Reason != "riser" {
		t.Fatalf("sent %s", fa.last(t).Body)
	}
	if r = run(t, fa.env(t), "slots", "clear", "h200-01", "3", "--reason", "fixed"); r.Code == 0 || !strings.Contains(r.ErrOut, "no passed validation") {
		t.Fatalf("a refused clear: %d %q", r.Code, r.ErrOut)
	}
	if r = run(t, fa.env(t), "alloc", "release", "0190aaaa-0000-7000-8000-000000000001", "--yes", "--report", "GPU 1 Xid 79 during training"); r.Code != 0 {
		t.Fatalf("release --report: %d %q", r.Code, r.ErrOut)
	}
	var rel apiv1.ReleaseRequest
	if json.Unmarshal(fa.last(t).Body, &rel) != nil || rel.Report != "GPU 1 Xid 79 during training" {
		t.Fatalf("sent %s", fa.last(t).Body)
	}
}
