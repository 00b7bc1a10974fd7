package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// eventsAfter polls GET /api/v1/events until want events arrived (a new event is readable
// once every older writing transaction has ended), resuming by cursor.
func (b *apiBundle) eventsAfter(token, cursor string, want int) ([]apiv1.Event, string) {
	b.t.Helper()
	var all []apiv1.Event
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		var page apiv1.EventPage
		b.must("GET", "/api/v1/events?wait=5s&after="+cursor, token, nil, 200, &page)
		all = append(all, page.Events...)
		if page.NextCursor != "" {
			cursor = page.NextCursor
		}
		if len(all) >= want {
			break
		}
	}
	return all, cursor
}

func TestEventsTenantSeesOwnAllocationEventsWithoutHostIdentity(t *testing.T) {
	b := setup(t)
	b.world()
	var a apiv1.Allocation
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &a)
	evs, cur := b.eventsAfter(b.tenant, "", 1)
	if len(evs) != 1 || evs[0].Type != "allocation.requested" || evs[0].AllocationID != a.ID {
		t.Fatalf("tenant events: %+v", evs)
	}
	var data map[string]any
	if err := json.Unmarshal(evs[0].Data, &data); err != nil || data["status"] != "requested" || data["allocation_id"] != a.ID {
		t.Fatalf("event data %s (%v)", evs[0].Data, err)
	}
	_, raw := b.do("GET", "/api/v1/events", b.tenant, nil)
	if strings.Contains(string(raw), "node_id") || strings.Contains(string(raw), "tenant_id") {
		t.Fatalf("a tenant's events name a node or tenant: %s", raw)
	}
	// The other tenant sees none of it; an operator sees the node.
	var other apiv1.EventPage
	b.must("GET", "/api/v1/events", b.other, nil, 200, &other)
	if len(other.Events) != 0 {
		t.Fatalf("tenant B sees tenant A's events: %+v", other.Events)
	}
	adminEvs, _ := b.eventsAfter(b.admin, "", 1)
	if len(adminEvs) != 1 || adminEvs[0].NodeID == "" || adminEvs[0].TenantID != b.tenID {
		t.Fatalf("operator view: %+v", adminEvs)
	}

	// A release is an event; resuming from the cursor repeats nothing.
	b.must("POST", "/api/v1/allocations/"+a.ID+"/release", b.tenant, nil, 200, nil)
	more, _ := b.eventsAfter(b.tenant, cur, 1)
	if len(more) != 1 || more[0].Type != "allocation.released" && more[0].Type != "allocation.releasing" {
		t.Fatalf("after the release: %+v", more)
	}
	if more[0].Cursor == evs[0].Cursor {
		t.Fatal("the resumed page repeats the last event")
	}
}

// A long poll parked on an empty log returns with the event as soon as it is readable, well
// inside its wait.
func TestEventsLongPollWakesOnNewEvent(t *testing.T) {
	b := setup(t)
	b.world()
	type answer struct {
		page apiv1.EventPage
		took time.Duration
		code int
		body []byte
	}
	got := make(chan answer, 1)
	go func() {
		start := time.Now()
		code, body := b.do("GET", "/api/v1/events?wait=60s", b.other, nil)
		var p apiv1.EventPage
		_ = json.Unmarshal(body, &p)
		got <- answer{p, time.Since(start), code, body}
	}()
	// The poll is parked before the event: nothing is readable for tenant B yet.
	var a apiv1.Allocation
	b.must("POST", "/api/v1/allocations", b.other, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &a)
	r := <-got
	if r.code != 200 || len(r.page.Events) != 1 || r.page.Events[0].AllocationID != a.ID {
		t.Fatalf("long poll: %d %s", r.code, r.body)
	}
	if r.took >= 60*time.Second {
		t.Fatalf("the poll waited out its whole wait (%s) instead of waking", r.took)
	}
}

func TestEventsRefuseBadQueries(t *testing.T) {
	b := setup(t)
	b.world()
	for _, q := range []string{"after=abc", "after=1-2-3", "wait=2m", "wait=-1s", "limit=0", "limit=1001", "since=yesterday", "cursor=1-1"} {
		code, body := b.do("GET", "/api/v1/events?"+q, b.tenant, nil)
		if code != 400 || apiError(t, body).Code != apiv1.CodeInvalidRequest {
			t.Errorf("?%s = %d %s", q, code, body)
		}
	}
	var page apiv1.EventPage
	b.must("GET", "/api/v1/events?since=1h&limit=5", b.tenant, nil, 200, &page)
	b.must("GET", "/api/v1/events?since=2020-01-02T15:04:05Z", b.tenant, nil, 200, &page)
}

func TestDrainWithNoticeTellsTenantsOnTheNode(t *testing.T) {
	b := setup(t)
	b.world()
	var a apiv1.Allocation
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &a)
	_, cur := b.eventsAfter(b.tenant, "", 1)

	for _, bad := range []string{`{"notice":"24h"}`, `{"reason":"disk swap"}`, `{"notice":"-1h","reason":"x"}`,
		`{"notice":"9000h","reason":"x"}`, `{"notice":"soon","reason":"x"}`, `{"notice":"1h","reason":"x","node":"n1"}`} {
		code, body := b.do("POST", "/api/v1/admin/nodes/n1/drain", b.admin, bad)
		if code != 400 {
			t.Errorf("drain %s = %d %s", bad, code, body)
		}
	}
	var n apiv1.Node
	b.must("GET", "/api/v1/admin/nodes/n1", b.admin, nil, 200, &n)
	if n.Draining {
		t.Fatal("a refused drain request drained the node")
	}

	before := time.Now()
	b.must("POST", "/api/v1/admin/nodes/n1/drain", b.admin, apiv1.MaintenanceRequest{Notice: "24h", Reason: "firmware update"}, 200, &n)
	if !n.Draining {
		t.Fatal("not drained")
	}
	// One audit row for the drain, naming the notice.
	if _, raw := b.do("GET", "/api/v1/admin/audit?action=node.drain&limit=5", b.admin, nil); strings.Count(string(raw), `"firmware update"`) != 1 {
		t.Fatalf("audit of the drain with notice: %s", raw)
	}
	evs, _ := b.eventsAfter(b.tenant, cur, 1)
	if len(evs) != 1 || evs[0].Type != "maintenance.scheduled" || evs[0].AllocationID != a.ID {
		t.Fatalf("tenant events after the notice: %+v", evs)
	}
	var d struct {
		Deadline time.Time `json:"deadline"`
		Reason   string    `json:"reason"`
	}
	if err := json.Unmarshal(evs[0].Data, &d); err != nil || d.Reason != "firmware update" ||
		d.Deadline.Before(before.Add(24*time.Hour-2*time.Second)) || d.Deadline.After(time.Now().Add(24*time.Hour)) {
		t.Fatalf("notice data %s (%v)", evs[0].Data, err)
	}
	if strings.Contains(string(evs[0].Data), n.ID) || strings.Contains(string(evs[0].Data), "n1") {
		t.Fatalf("the tenant's notice names the node: %s", evs[0].Data)
	}

	var mine, theirs, all apiv1.List[apiv1.MaintenanceNotice]
	b.must("GET", "/api/v1/maintenance", b.tenant, nil, 200, &mine)
	b.must("GET", "/api/v1/maintenance", b.other, nil, 200, &theirs)
	b.must("GET", "/api/v1/maintenance", b.admin, nil, 200, &all)
	if len(mine.Items) != 1 || mine.Items[0].NodeID != "" || mine.Items[0].NodeName != "" || len(mine.Items[0].Allocations) != 1 || mine.Items[0].Allocations[0] != a.ID {
		t.Fatalf("tenant A's notices: %+v", mine.Items)
	}
	if len(theirs.Items) != 0 {
		t.Fatalf("tenant B sees a notice about tenant A's allocation: %+v", theirs.Items)
	}
	if len(all.Items) != 1 || all.Items[0].NodeName != "n1" || all.Items[0].Reason != "firmware update" {
		t.Fatalf("operator's notices: %+v", all.Items)
	}
	var other apiv1.EventPage
	b.must("GET", "/api/v1/events", b.other, nil, 200, &other)
	if len(other.Events) != 0 {
		t.Fatalf("tenant B got events: %+v", other.Events)
	}
	// A plain drain (no body) still works and sends nothing.
	b.must("POST", "/api/v1/admin/nodes/n1/undrain", b.admin, nil, 200, nil)
	b.must("POST", "/api/v1/admin/nodes/n1/drain", b.admin, nil, 200, nil)
	b.must("GET", "/api/v1/maintenance", b.admin, nil, 200, &all)
	if len(all.Items) != 1 {
		t.Fatalf("a drain without notice recorded one: %+v", all.Items)
	}
}

// Provisioning phases and wipes reach the tenant as events, whatever wrote them (the host's
// progress and result paths update node_tasks and slot_wipe_proofs; here plain SQL does):
// one event per new phase, a new attempt's phases again, never the phase's detail.
func TestEventsForPhasesAndWipes(t *testing.T) {
	b := setup(t)
	b.world()
	var a apiv1.Allocation
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &a)
	_, cur := b.eventsAfter(b.tenant, "", 1)

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var task string
	if err := conn.QueryRow(ctx, `INSERT INTO node_tasks (node_id, allocation_id, type, payload, not_after)
		SELECT node_id, id, 'slice.vm_provision', '{}', now() + interval '1 hour' FROM allocations WHERE id = $1
		RETURNING id::text`, a.ID).Scan(&task); err != nil {
		t.Fatal(err)
	}
	phase := func(name, started string) map[string]any {
		return map[string]any{"name": name, "started_at": started, "duration_ms": 12, "status": "ok", "detail": "/dev/nvme0n1 on host n1"}
	}
	t1, t2 := "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"
	for _, phases := range [][]map[string]any{
		{phase("leases", t1), phase("host_checks", t1)},
		{phase("leases", t1), phase("host_checks", t1)}, // the same list again: nothing new
		{phase("leases", t1), phase("host_checks", t1), phase("image", t1)},
		{phase("leases", t2)}, // the next attempt starts over
	} {
		raw, _ := json.Marshal(phases)
		if _, err := conn.Exec(ctx, `UPDATE node_tasks SET phases = $2 WHERE id = $1`, task, raw); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO slot_wipe_proofs (slot_id, node_id, allocation_id, verified, error)
		SELECT c.slot_id, c.node_id, c.allocation_id, false, 'simulated' FROM allocation_resource_claims c WHERE c.allocation_id = $1`, a.ID); err != nil {
		t.Fatal(err)
	}
	evs, _ := b.eventsAfter(b.tenant, cur, 5)
	var got []string
	for _, e := range evs {
		if strings.Contains(string(e.Data), "nvme") || strings.Contains(string(e.Data), "n1") {
			t.Fatalf("event data names host devices: %s", e.Data)
		}
		var d struct {
			Phase string `json:"phase"`
			Index int    `json:"index"`
		}
		_ = json.Unmarshal(e.Data, &d)
		got = append(got, fmt.Sprintf("%s:%s:%d", e.Type, d.Phase, d.Index))
	}
	want := []string{"allocation.phase:leases:0", "allocation.phase:host_checks:1", "allocation.phase:image:2", "allocation.phase:leases:0", "allocation.wipe::0"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
}

// A cursor the event log's retention overtook is answered 410 cursor_expired in our words,
// saying how to start again, never with a silent gap.
func TestEventsCursorOvertakenByRetentionIsGone(t *testing.T) {
	b := setup(t)
	b.world()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, typ := range []string{"test.old_one", "test.old_two"} {
		if _, err := conn.Exec(ctx, `INSERT INTO events (type, created_at) VALUES ($1, now() - interval '40 days')`, typ); err != nil {
			t.Fatal(err)
		}
	}
	var page apiv1.EventPage
	// An event is readable once every older transaction in the cluster (other tests') ended.
	b.must("GET", "/api/v1/events?limit=1&wait=30s", b.admin, nil, 200, &page)
	if len(page.Events) != 1 || page.Events[0].Type != "test.old_one" {
		t.Fatalf("first event = %+v", page.Events)
	}
	b.eventsAfter(b.admin, page.NextCursor, 1) // the second one is readable too, so the prune reaches it
	if n, err := b.st.PruneEvents(ctx, 30*24*time.Hour, 100); err != nil || n != 2 {
		t.Fatalf("prune removed %d, %v; want the 2 old events", n, err)
	}
	code, body := b.do("GET", "/api/v1/events?after="+page.NextCursor, b.admin, nil)
	e := apiError(t, body)
	if code != 410 || e.Code != apiv1.CodeCursorExpired || !strings.Contains(e.Message, "without a cursor") || strings.Contains(e.Message, "SQLSTATE") {
		t.Fatalf("read after an overtaken cursor = %d %s", code, body)
	}
	b.must("GET", "/api/v1/events", b.admin, nil, 200, &page)
}
