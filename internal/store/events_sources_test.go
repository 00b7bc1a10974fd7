package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/store"
)

// Quota changes, reservation changes and slot health changes reach the event log from the
// database itself (migration 026), even when plain SQL makes them: the tenant hears about
// its quota and about the health of a slot its live allocation holds (no device names), and
// operators see every slot health change.
func TestQuotaAndHealthChangesAreEvents(t *testing.T) {
	w := wipeGateSetup(t, "ev-src", 54)
	ctx := context.Background()
	var tenant, alloc string
	if err := w.conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ('ev-src') RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`INSERT INTO tenant_quotas (tenant_id, sku, max_gpus) VALUES ($1, 'h200-sxm-slice', 8)`,
		`UPDATE tenant_quotas SET max_gpus = 4 WHERE tenant_id = $1`,
		`DELETE FROM tenant_quotas WHERE tenant_id = $1`,
	} {
		if _, err := w.conn.Exec(ctx, sql, tenant); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var res string
	if err := w.conn.QueryRow(ctx, `INSERT INTO capacity_reservations (tenant_id, sku, region, node_id, gpus, price_snapshot)
		VALUES ($1, 'h200-sxm-slice', 'lab', $2, 1, '{}') RETURNING id::text`, tenant, w.nodeID).Scan(&res); err != nil {
		t.Fatal(err)
	}
	if _, err := w.conn.Exec(ctx, `UPDATE capacity_reservations SET status = 'cancelled', ended_at = now() WHERE id = $1`, res); err != nil {
		t.Fatal(err)
	}
	if err := w.conn.QueryRow(ctx, `INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot, status)
		VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 1, 'lab', $2, '{}', 'active') RETURNING id::text`, tenant, w.nodeID).Scan(&alloc); err != nil {
		t.Fatal(err)
	}
	if _, err := w.conn.Exec(ctx, `INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, resource_snapshot)
		VALUES ($1, $2, $3, 'slot', '{}')`, alloc, w.nodeID, w.slotID); err != nil {
		t.Fatal(err)
	}
	// The database names the allocation from the slot's live claim.
	if _, err := w.conn.Exec(ctx, `INSERT INTO slot_health_events (slot_id, node_id, allocation_id, source, signal, action, reason)
		VALUES ($1, $2, NULL, 'kernel', 'xid:79', 'quarantine', 'NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus')`, w.slotID, w.nodeID); err != nil {
		t.Fatal(err)
	}
	want := []string{"quota.set", "quota.set", "quota.deleted", "reservation.active", "reservation.cancelled", "allocation.active", "allocation.health"}
	// Events become readable once every older writing transaction of the cluster has ended
	// (other tests' included): poll until they are all there, within a deadline.
	var mine []store.Event
	for deadline := time.Now().Add(30 * time.Second); ; {
		var err error
		if mine, _, err = w.st.ReadEvents(ctx, store.EventFilter{TenantID: tenant, Limit: 100}); err != nil {
			t.Fatal(err)
		}
		if len(mine) >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling the log; the deadline bounds it
	}
	var types []string
	var health map[string]any
	for _, e := range mine {
		types = append(types, e.Type)
		if e.Type == "allocation.health" {
			if err := json.Unmarshal(e.Data, &health); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(types) != len(want) {
		t.Fatalf("tenant events %v, want %v", types, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("tenant events %v, want %v", types, want)
		}
	}
	if health["health"] != "quarantined" || health["signal"] != "xid:79" || len(health) != 3 {
		t.Fatalf("the tenant's health event %v: want the allocation, its new health and the signal only", health)
	}
	all, _, err := w.st.ReadEvents(ctx, store.EventFilter{TenantID: "", After: store.EventCursor{}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var ops int
	for _, e := range all {
		if e.Type == "slot.health" && e.TenantID == "" && e.NodeID == w.nodeID {
			ops++
		}
	}
	if ops != 1 {
		t.Fatalf("%d operator slot.health events, want 1", ops)
	}
}
