package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

func recordEvent(t *testing.T, st *store.Store, nodeID, slotID, action, reason string) (apiv1.HealthEvent, error) {
	t.Helper()
	var ev apiv1.HealthEvent
	err := st.InTx(context.Background(), func(tx *store.Tx) error {
		var err error
		ev, err = tx.RecordHealthEvent(context.Background(), store.HealthEventRecord{SlotID: slotID, NodeID: nodeID,
			Source: "operator", Signal: "operator:" + action, Action: action, Reason: reason, Actor: "test"})
		return err
	})
	return ev, err
}

func recordValidation(t *testing.T, st *store.Store, nodeID, slotID string, passed, simulated bool) {
	t.Helper()
	if err := st.InTx(context.Background(), func(tx *store.Tx) error {
		_, err := tx.RecordValidation(context.Background(), store.ValidationRecord{SlotID: slotID, NodeID: nodeID, Level: "quick",
			Passed: passed, Simulated: simulated, Checks: []apiv1.ValidationCheck{{Name: "pcie", Passed: passed}}, Summary: "pcie"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func slotHealth(t *testing.T, st *store.Store, nodeID string, index int) apiv1.SlotHealth {
	t.Helper()
	h, err := st.SlotHealth(context.Background(), nodeID, index, 50)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func wantConstraint(t *testing.T, what string, err error, constraint string) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.ConstraintName != constraint {
		t.Fatalf("%s: want the database's %s refusal, got %v", what, constraint, err)
	}
}

// A quarantined slot is out of placement (the candidate filter and the lock both skip it) and
// the database refuses to reserve it by any path, plain SQL included; its node is not sold
// whole either.
func TestQuarantinedSlotIsNeverReserved(t *testing.T) {
	w := wipeGateSetup(t, "hq-fence", 50)
	ctx := context.Background()
	if _, err := recordEvent(t, w.st, w.nodeID, w.slotID, "quarantine", "xid 79"); err != nil {
		t.Fatal(err)
	}
	_, err := w.conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'reserved' WHERE id = $1`, w.slotID)
	wantConstraint(t, "reserving a quarantined slot", err, store.QuarantineFence)
	if err := store.Translate(err); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the fence is a conflict in our words, got %v", err)
	}
	cands, err := w.st.SliceCandidates(ctx, store.PlacementQuery{SKU: "h200-sxm-slice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cands {
		if c.SlotID == w.slotID {
			t.Fatal("placement offered a quarantined slot")
		}
	}
	if len(cands) != 7 {
		t.Fatalf("the other 7 slots stay on sale, got %d candidates", len(cands))
	}
	err = w.st.InTx(ctx, func(tx *store.Tx) error {
		locked, err := tx.LockAvailableSlots(ctx, w.nodeID, []string{w.slotID}, []string{w.slotID, w.slot1}, 2, "")
		if err != nil {
			return err
		}
		if len(locked) != 1 || locked[0].ID != w.slot1 {
			t.Fatalf("the lock re-check must skip the quarantined slot, got %+v", locked)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if bm, err := w.st.BaremetalCandidates(ctx, store.PlacementQuery{SKU: "h200-sxm-baremetal-8g"}); err != nil || len(bm) != 0 {
		t.Fatalf("a node with a quarantined slot is not sold whole: %v %v", bm, err)
	}
	var allocID string
	if err := w.conn.QueryRow(ctx, `WITH t AS (INSERT INTO tenants (name) VALUES ('hq-tenant') RETURNING id)
		INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
		SELECT t.id, 'h200-sxm-baremetal-8g', 'baremetal', 8, 'lab', $1, '{}' FROM t RETURNING id`, w.nodeID).Scan(&allocID); err != nil {
		t.Fatal(err)
	}
	_, err = w.conn.Exec(ctx, `INSERT INTO allocation_resource_claims (allocation_id, node_id, claim_kind, resource_snapshot)
		VALUES ($1, $2, 'node_exclusive', '{}')`, allocID, w.nodeID)
	wantConstraint(t, "a node_exclusive claim on a node with a quarantined slot", err, store.QuarantineFence)
}

// Health changes only through an event, so every change is in the history; the history is
// append-only.
func TestSlotHealthChangesOnlyThroughEvents(t *testing.T) {
	w := wipeGateSetup(t, "hq-guard", 51)
	ctx := context.Background()
	_, err := w.conn.Exec(ctx, `UPDATE node_resource_slots SET health = 'quarantined' WHERE id = $1`, w.slotID)
	wantConstraint(t, "a direct health update", err, "slot_health_guard")
	ev, err := recordEvent(t, w.st, w.nodeID, w.slotID, "degrade", "link at 16 GT/s x8 of 32 GT/s x16")
	if err != nil {
		t.Fatal(err)
	}
	if ev.HealthBefore != "healthy" || ev.HealthAfter != "degraded" {
		t.Fatalf("event %+v", ev)
	}
	_, err = w.conn.Exec(ctx, `UPDATE node_resource_slots SET health = 'healthy' WHERE id = $1`, w.slotID)
	wantConstraint(t, "a direct clear", err, "slot_health_guard")
	_, err = w.conn.Exec(ctx, `DELETE FROM slot_health_events`)
	wantConstraint(t, "deleting history", err, "slot_health_append_only")
	// A quarantine wins over a later degrade; a record changes nothing.
	if _, err := recordEvent(t, w.st, w.nodeID, w.slotID, "quarantine", "xid 48"); err != nil {
		t.Fatal(err)
	}
	if ev, _ = recordEvent(t, w.st, w.nodeID, w.slotID, "degrade", "xid 92"); ev.HealthAfter != "quarantined" {
		t.Fatalf("a degrade must not lift a quarantine: %+v", ev)
	}
	h := slotHealth(t, w.st, w.nodeID, 0)
	if h.Health != "quarantined" || h.HealthReason != "xid 48" || len(h.Events) != 3 {
		t.Fatalf("health %+v", h)
	}
}

// Clearing a quarantine needs a passed validation recorded after the quarantine began: one
// from before does not count, a failed one quarantines again, a simulated one counts only where
// simulated hosts are allowed.
func TestClearNeedsPassedValidationSinceQuarantine(t *testing.T) {
	w := wipeGateSetup(t, "hq-clear", 52)
	recordValidation(t, w.st, w.nodeID, w.slotID, true, false) // before the quarantine
	if _, err := recordEvent(t, w.st, w.nodeID, w.slotID, "quarantine", "xid 79"); err != nil {
		t.Fatal(err)
	}
	_, err := recordEvent(t, w.st, w.nodeID, w.slotID, "clear", "looks fine")
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a clear without a validation since the quarantine must be refused as a conflict, got %v", err)
	}
	recordValidation(t, w.st, w.nodeID, w.slotID, true, true) // simulated: not on a controller that sells no simulated host
	if _, err := recordEvent(t, w.st, w.nodeID, w.slotID, "clear", "looks fine"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a simulated validation must not clear a real slot, got %v", err)
	}
	recordValidation(t, w.st, w.nodeID, w.slotID, false, false)
	h := slotHealth(t, w.st, w.nodeID, 0)
	if h.Health != "quarantined" || h.Events[0].Source != "validation" || h.Events[0].Action != "quarantine" {
		t.Fatalf("a failed validation is a quarantine event: %+v", h.Events[0])
	}
	recordValidation(t, w.st, w.nodeID, w.slotID, true, false)
	ev, err := recordEvent(t, w.st, w.nodeID, w.slotID, "clear", "repaired and validated")
	if err != nil {
		t.Fatal(err)
	}
	if ev.HealthAfter != "healthy" {
		t.Fatalf("cleared: %+v", ev)
	}
	if h := slotHealth(t, w.st, w.nodeID, 0); h.Health != "healthy" || h.HealthReason != "" || len(h.Validations) != 4 {
		t.Fatalf("after clear: %+v", h)
	}
}

// A node with half or more of its enabled slots quarantined is drained, with the reason kept;
// the fleet summary lists it first.
func TestHalfQuarantinedNodeDrains(t *testing.T) {
	w := wipeGateSetup(t, "hq-drain", 53)
	other := addNode(t, w.st, "hq-fine", 54)
	ctx := context.Background()
	slots, err := w.st.ListSlots(ctx, w.nodeID)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := recordEvent(t, w.st, w.nodeID, slots[i].ID, "quarantine", "xid 95"); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := w.st.GetNode(ctx, w.nodeID); n.Draining {
		t.Fatal("3 of 8 quarantined must not drain the node")
	}
	if _, err := recordEvent(t, w.st, w.nodeID, slots[3].ID, "quarantine", "xid 95"); err != nil {
		t.Fatal(err)
	}
	if n, _ := w.st.GetNode(ctx, w.nodeID); !n.Draining {
		t.Fatal("4 of 8 quarantined must drain the node")
	}
	fleet, err := w.st.FleetHealth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, f := range fleet {
		names = append(names, f.Node)
	}
	if len(fleet) != 2 || fleet[0].Node != "hq-drain" || fleet[0].Quarantined != 4 || !fleet[0].Draining ||
		fleet[0].DrainReason == "" || !slices.Contains(names, other.Name) {
		t.Fatalf("fleet summary, worst first: %+v", fleet)
	}
	q, err := w.st.QuarantinedSlots(ctx)
	if err != nil || q[[2]string{"hq-drain", "h200-sxm-slice"}] != 4 {
		t.Fatalf("quarantined gauge: %v %v", q, err)
	}
}
