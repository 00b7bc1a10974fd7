package store_test

import (
	"context"
	"encoding/json"
	"sort"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// A node is leased only the tasks its hostd decodes, by the schemas its last heartbeat
// reported; a node that reported none is a gpuaas-hostd 0.1.0 (version 1 of the types it
// knew). The rest stay queued, and task.WaitReason, which alloc show and nodes show print,
// agrees with the database on each.
func TestLeaseOnlyWhatTheHostDecodes(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	node := addNode(t, st, "skew-1", 80).ID
	conn := connect(t, url)
	insert := func(typ string, version int) string {
		t.Helper()
		var id string
		if err := conn.QueryRow(ctx, `INSERT INTO node_tasks (node_id, type, payload, not_after, schema_version)
			VALUES ($1, $2, '{}', now() + interval '1 hour', $3) RETURNING id::text`, node, typ, version).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	heartbeat := func(facts any) json.RawMessage {
		t.Helper()
		hb, _ := json.Marshal(map[string]any{"agent_version": "v-test", "facts": facts})
		if err := st.RecordHeartbeats(ctx, []store.HeartbeatRecord{{NodeID: node, At: time.Now(), Facts: hb}}); err != nil {
			t.Fatal(err)
		}
		return hb
	}
	v1 := insert("slice.vm_provision", 1)
	v2 := insert("slice.vm_provision", 2)
	future := insert("slot.future_task", 1)
	names := map[string]string{v1: "vm_provision v1", v2: "vm_provision v2", future: "future type"}
	leased := func() []string {
		t.Helper()
		trs, err := st.LeaseTasks(ctx, node, time.Minute, 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tr := range trs {
			out = append(out, names[tr.ID])
		}
		sort.Strings(out)
		return out
	}
	check := func(want ...string) {
		t.Helper()
		got := leased()
		if len(got) != len(want) || (len(got) > 0 && got[0] != want[0]) || (len(got) > 1 && got[1] != want[1]) {
			t.Fatalf("leased %v, want %v", got, want)
		}
	}

	// A 0.1.0 host (facts without task_schemas): version 1 of a type it knew, nothing else.
	old := heartbeat(map[string]any{"hostname": "h"})
	check("vm_provision v1")
	for id, wantWait := range map[string]bool{v2: true, future: true} {
		var typ string
		var v int
		_ = conn.QueryRow(ctx, `SELECT type, schema_version FROM node_tasks WHERE id = $1`, id).Scan(&typ, &v)
		if why := task.WaitReason(old, typ, v); (why != "") != wantWait {
			t.Fatalf("%s: wait reason %q", names[id], why)
		}
	}
	if why := task.WaitReason(old, "slice.vm_provision", 2); why != "host needs a gpuaas-hostd that decodes slice.vm_provision schema 2 (it runs v-test)" {
		t.Fatalf("wait reason %q", why)
	}
	// An upgraded host that decodes version 2 and the new type gets both.
	heartbeat(map[string]any{"task_schemas": map[string][]int{"slice.vm_provision": {1, 2}, "slot.future_task": {1}}})
	check("future type", "vm_provision v2")
}

// node_tasks inserts rely on schema_version's default (1): when a type's current schema
// moves past 1, its inserts must say so.
func TestEveryTypeIsAtSchemaOne(t *testing.T) {
	for typ := range task.Schemas() {
		if v := task.CurrentSchema(typ); v != 1 {
			t.Fatalf("%s is at schema %d: node_tasks inserts write the column's default 1; set schema_version where it is queued", typ, v)
		}
	}
}

// The previous release's lease statement (it knows nothing of schema versions) is held to the
// same rule by the database: it leases what the host decodes and leaves the rest queued.
func TestPreviousReleaseLeaseCannotHandOutWhatTheHostDoesNotDecode(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	node := addNode(t, st, "skew-2", 81).ID
	conn := connect(t, url)
	var v1, v2, future string
	for _, tk := range []struct {
		typ string
		v   int
		id  *string
	}{{"slice.vm_provision", 1, &v1}, {"slice.vm_provision", 2, &v2}, {"slot.future_task", 1, &future}} {
		if err := conn.QueryRow(ctx, `INSERT INTO node_tasks (node_id, type, payload, not_after, schema_version)
			VALUES ($1, $2, '{}', now() + interval '1 hour', $3) RETURNING id::text`, node, tk.typ, tk.v).Scan(tk.id); err != nil {
			t.Fatal(err)
		}
	}
	// v0.1.0's LeaseTasks, verbatim.
	const previousLease = `UPDATE node_tasks SET status = 'leased', attempt = attempt + 1,
			lease_expires_at = now() + make_interval(secs => $2::float8), updated_at = now()
		WHERE id IN (SELECT id FROM node_tasks
		             WHERE node_id = $1 AND not_after > now() AND attempt < max_attempts
		               AND (status = 'queued' OR (status = 'leased' AND lease_expires_at < now()))
		             ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED)
		RETURNING id::text`
	leased := map[string]bool{}
	rows, err := conn.Query(ctx, previousLease, node, 60.0, 10)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		leased[id] = true
	}
	rows.Close()
	if !leased[v1] || leased[v2] || leased[future] || len(leased) != 1 {
		t.Fatalf("the previous release's lease took %v; want only the version 1 task (%s)", leased, v1)
	}
	var queued int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM node_tasks WHERE id IN ($1, $2) AND status = 'queued' AND attempt = 0`, v2, future).Scan(&queued); err != nil || queued != 2 {
		t.Fatalf("%d of the undecodable tasks still queued untouched (%v), want 2", queued, err)
	}
	// Once the host decodes both, the previous release still takes only the new type's
	// version 1 task: it would sign the version 2 one as version 1. This release takes it.
	hb, _ := json.Marshal(map[string]any{"agent_version": "new", "facts": map[string]any{
		"task_schemas": map[string][]int{"slice.vm_provision": {1, 2}, "slot.future_task": {1}}}})
	if err := st.RecordHeartbeats(ctx, []store.HeartbeatRecord{{NodeID: node, At: time.Now(), Facts: hb}}); err != nil {
		t.Fatal(err)
	}
	rows, err = conn.Query(ctx, previousLease, node, 60.0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		got = append(got, id)
	}
	rows.Close()
	if len(got) != 1 || got[0] != future {
		t.Fatalf("the previous release's lease took %v once the host decodes everything; want only %s", got, future)
	}
	trs, err := st.LeaseTasks(ctx, node, time.Minute, 10)
	if err != nil || len(trs) != 1 || trs[0].ID != v2 {
		t.Fatalf("this release's lease took %+v (%v); want the version 2 task", trs, err)
	}
}
