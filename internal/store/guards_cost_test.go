package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The guards of a reservation cost a function call per changed slot row and one per claims
// statement, not a query per row (migration 032): reserving four slots of one node with
// their claims, as claimsInsertSQL does, calls the slot's transition guard once per slot,
// the slot-claim checks once, and neither the per-row claim trigger, the table-driven
// transition check, the separate wipe-gate trigger, nor anything that writes or fills in a
// device snapshot (a claim refers to its slot's, migration 034). The guarantees themselves are the
// wipe gate, transition, simulated-node and mutual-exclusion tests'.
func TestReservationGuardsRunOncePerRowOrStatement(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "guards-a", 70)
	tx := countingTx(t, url)
	var alloc string
	if err := tx.QueryRow(ctx, `WITH t AS (INSERT INTO tenants (name) VALUES ('guards') RETURNING id)
		INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
		SELECT t.id, 'h200-sxm-slice', 'gpu_slice', 4, '', $1, '{}' FROM t RETURNING id::text`, n.ID).Scan(&alloc); err != nil {
		t.Fatal(err)
	}
	calls := func() map[string]int {
		return functionCalls(t, tx, "claims_mutual_exclusion", "claims_slot_checks", "check_status_transition", "slot_wipe_gate",
			"slot_transition_guard", "claims_device_snapshot", "slots_snapshot_devices", "claims_record_fixed")
	}
	before := calls()
	if _, err := tx.Exec(ctx, `WITH s AS (SELECT id, node_id, capacity_metadata->>'fabric_vf_pci_address' AS vf, device_snapshot_id FROM node_resource_slots
			WHERE node_id = $2 ORDER BY slot_index LIMIT 4),
		c AS (INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, fabric_vf_pci_address, resource_snapshot, device_snapshot_id)
			SELECT $1, node_id, id, 'slot', vf, '{}', device_snapshot_id FROM s RETURNING slot_id)
		UPDATE node_resource_slots SET status = 'reserved', status_reason = '' WHERE id IN (SELECT slot_id FROM c)`, alloc, n.ID); err != nil {
		t.Fatal(err)
	}
	after := calls()
	want := map[string]int{"claims_mutual_exclusion": 0, "claims_slot_checks": 1, "check_status_transition": 0, "slot_wipe_gate": 0, "slot_transition_guard": 4,
		"claims_device_snapshot": 0, "slots_snapshot_devices": 0, "claims_record_fixed": 0}
	for f, w := range want {
		if got := after[f] - before[f]; got != w {
			t.Errorf("reserving 4 slots with their claims called %s %d times, want %d", f, got, w)
		}
	}
}

// The transition checks are generated from the state machine tables and follow them: every
// pair of statuses is allowed exactly when its table lists it, and a transition added to a
// table is allowed at once (the table stays the source of truth, as migrations 004 and 008
// used it).
func TestTransitionChecksFollowTheirTables(t *testing.T) {
	_, url := open(t)
	ctx := context.Background()
	conn := connect(t, url)
	for _, m := range []struct{ table, check, statuses string }{
		{"slot_transitions", "slot_transition_allowed",
			"'available', 'reserved', 'provisioning', 'active', 'releasing', 'cleanup', 'cleanup_blocked', 'failed', 'disabled'"},
		{"allocation_transitions", "allocation_transition_allowed",
			"'requested', 'provisioning', 'active', 'releasing', 'released', 'failed'"},
	} {
		var pairs, disagree int
		if err := conn.QueryRow(ctx, `WITH s(v) AS (SELECT unnest(ARRAY[`+m.statuses+`]))
			SELECT count(*), count(*) FILTER (WHERE `+m.check+`(f.v, t.v) IS DISTINCT FROM
				EXISTS (SELECT 1 FROM `+m.table+` x WHERE x.from_status = f.v AND x.to_status = t.v))
			FROM s f, s t`).Scan(&pairs, &disagree); err != nil {
			t.Fatal(err)
		}
		if pairs == 0 || disagree != 0 {
			t.Errorf("%s: %d of %d status pairs disagree with %s", m.check, disagree, pairs, m.table)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the added transition is thrown away
	var before, after bool
	if err := tx.QueryRow(ctx, `SELECT slot_transition_allowed('disabled', 'cleanup')`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO slot_transitions VALUES ('disabled', 'cleanup')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT slot_transition_allowed('disabled', 'cleanup')`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if before || !after {
		t.Fatalf("disabled -> cleanup allowed %v before it was added to slot_transitions, %v after; want false, true", before, after)
	}
}

// Putting reserved slots back on sale does not call the simulated-wipe refusal (its WHEN
// clause asks for a simulated last wipe); the failed-claims release (migration 029) is still
// called once per slot. The rules themselves are the dispatcher's simulated-wipe and the
// lifecycle's failed-claim tests'.
func TestReleaseCallsNoWipeCheckForARealWipe(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "guards-r", 71)
	tx := countingTx(t, url)
	if _, err := tx.Exec(ctx, `UPDATE node_resource_slots SET status = 'reserved' WHERE node_id = $1 AND slot_index < 4`, n.ID); err != nil {
		t.Fatal(err)
	}
	calls := func() map[string]int {
		return functionCalls(t, tx, "slot_back_on_sale_releases_failed_claims", "slots_refuse_simulated_wipe")
	}
	before := calls()
	if _, err := tx.Exec(ctx, `UPDATE node_resource_slots SET status = 'available' WHERE node_id = $1 AND slot_index < 4`, n.ID); err != nil {
		t.Fatal(err)
	}
	after := calls()
	want := map[string]int{"slot_back_on_sale_releases_failed_claims": 4, "slots_refuse_simulated_wipe": 0}
	for f, w := range want {
		if got := after[f] - before[f]; got != w {
			t.Errorf("releasing 4 slots called %s %d times, want %d", f, got, w)
		}
	}
}

// countingTx is a transaction on its own connection that counts its PL/pgSQL function calls
// (track_functions); the test's writes are rolled back at cleanup.
func countingTx(t *testing.T, url string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := connect(t, url).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) }) //nolint:errcheck // the test's writes are thrown away
	if _, err := tx.Exec(ctx, `SET LOCAL track_functions = 'pl'`); err != nil {
		t.Fatal(err)
	}
	return tx
}

// functionCalls is how many times countingTx's transaction has called each named function.
func functionCalls(t *testing.T, tx pgx.Tx, names ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, f := range names {
		var c int
		if err := tx.QueryRow(context.Background(), `SELECT coalesce(pg_stat_get_xact_function_calls(to_regproc($1)::oid), 0)`, f).Scan(&c); err != nil {
			t.Fatal(err)
		}
		out[f] = c
	}
	return out
}
