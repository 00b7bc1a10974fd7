package store_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/store"
)

// snapshotsBundle is a node with a tenant, a reservation of two of its slots made the way the
// controller makes one, and a raw connection.
type snapshotsBundle struct {
	st       *store.Store
	conn     *pgx.Conn
	nodeID   string
	slotIDs  []string // the node's slots by index
	tenantID string
}

func snapshotsSetup(t *testing.T, name string, host int) snapshotsBundle {
	t.Helper()
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, name, host)
	b := snapshotsBundle{st: st, conn: connect(t, url), nodeID: n.ID}
	slots, err := st.ListSlots(ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		b.slotIDs = append(b.slotIDs, s.ID)
	}
	if err := b.conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ($1) RETURNING id::text`, name).Scan(&b.tenantID); err != nil {
		t.Fatal(err)
	}
	return b
}

// reserve places an allocation on the given slots as the controller does (lock, then the
// claims insert), and returns it as written and the snapshots the lock handed out.
func (b snapshotsBundle) reserve(t *testing.T, slotIDs []string) (store.AllocationRecord, []json.RawMessage) {
	t.Helper()
	ctx := context.Background()
	var rec store.AllocationRecord
	var snaps []json.RawMessage
	err := b.st.InTx(ctx, func(tx *store.Tx) error {
		locked, err := tx.LockAvailableSlots(ctx, b.nodeID, slotIDs, slotIDs, len(slotIDs), "")
		if err != nil {
			return err
		}
		if len(locked) != len(slotIDs) {
			t.Fatalf("locked %d slots, want %d", len(locked), len(slotIDs))
		}
		var claims []store.NewClaim
		for _, l := range locked {
			claims = append(claims, store.NewClaim{Kind: "slot", NodeID: l.NodeID, SlotID: l.ID, FabricVF: l.FabricVF, Snapshot: l.Snapshot})
			snaps = append(snaps, l.Snapshot)
		}
		rec, _, err = tx.InsertAllocationRecord(ctx, store.NewAllocation{TenantID: b.tenantID, SKU: "h200-sxm-slice",
			CapacityShape: "gpu_slice", GPUs: len(slotIDs), Region: "lab", NodeID: b.nodeID, PriceSnapshot: map[string]any{}}, claims)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec, snaps
}

// slotsOffTheirDevices counts the slots whose current snapshot is not the one their devices
// make now.
func (b snapshotsBundle) slotsOffTheirDevices(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.conn.QueryRow(context.Background(), `SELECT count(*) FROM node_resource_slots s
		LEFT JOIN slot_device_snapshots d ON d.id = s.device_snapshot_id
		WHERE d.snapshot IS DISTINCT FROM slot_device_snapshot(s)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b snapshotsBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A slot claim records the devices its tenant was given as a reference to its slot's device
// snapshot, written once per distinct content of the slot's devices: the claim's row stays
// small (its insert and its status changes do not write a kilobyte of snapshot each), a
// reservation and a release write no snapshot, every reader sees the devices the lock handed
// out, and a later change of the slot's devices, or of its node's housekeeping CPUs, gives the
// slot a new snapshot without touching what the old claim records.
func TestClaimRecordsItsSlotsDevicesOnce(t *testing.T) {
	b := snapshotsSetup(t, "snap-once", 60)
	ctx := context.Background()
	if n := b.slotsOffTheirDevices(t); n != 0 {
		t.Fatalf("%d new slots do not point at a snapshot of their devices", n)
	}
	snapshots := func() int { return b.count(t, `SELECT count(*) FROM slot_device_snapshots`) }
	before := snapshots()
	rec, handed := b.reserve(t, b.slotIDs[:2])
	if size := b.count(t, `SELECT max(pg_column_size(c.*)) FROM allocation_resource_claims c WHERE allocation_id = $1`, rec.ID); size > 300 {
		t.Errorf("a slot claim's row is %d bytes: it carries its device snapshot instead of referring to it", size)
	}
	if n := b.count(t, `SELECT count(*) FROM allocation_resource_claims c JOIN node_resource_slots s ON s.id = c.slot_id
		JOIN slot_device_snapshots d ON d.id = c.device_snapshot_id
		WHERE c.allocation_id = $1 AND d.id = s.device_snapshot_id AND d.snapshot = slot_device_snapshot(s)`, rec.ID); n != 2 {
		t.Fatalf("%d of 2 claims record their slot's current snapshot", n)
	}
	for i, c := range rec.Claims {
		var want map[string]any
		if err := json.Unmarshal(handed[i], &want); err != nil {
			t.Fatal(err)
		}
		if c.SlotID != want["slot_id"] || c.PCIAddress != want["pci_address"] || c.MACAddress != want["mac_address"] ||
			c.NVMeDevice != want["nvme_device"] || c.PrivateIP != want["private_ip"] || c.FabricVF != want["fabric_vf_pci_address"] {
			t.Errorf("claim %d reads %+v; the lock handed out %s", i, c, handed[i])
		}
	}
	recorded := func() ([]json.RawMessage, []json.RawMessage) {
		t.Helper()
		var plan []json.RawMessage
		var infos map[string]store.DispatchInfo
		err := b.st.InTx(ctx, func(tx *store.Tx) error {
			var err error
			if plan, err = tx.ClaimSnapshots(ctx, rec.ID); err != nil {
				return err
			}
			infos, err = tx.DispatchInfos(ctx, []string{rec.ID})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return plan, infos[rec.ID].Snapshots
	}
	sameJSON := func(what string, got, want []json.RawMessage) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d snapshots, want %d", what, len(got), len(want))
		}
		for i := range got {
			var g, w any
			if json.Unmarshal(got[i], &g) != nil || json.Unmarshal(want[i], &w) != nil || !reflect.DeepEqual(g, w) {
				t.Errorf("%s: snapshot %d is %s, want %s", what, i, got[i], want[i])
			}
		}
	}
	plan, dispatch := recorded()
	sameJSON("the task plan's snapshots", plan, handed)
	sameJSON("the dispatcher's snapshots", dispatch, handed)

	// The slot's devices and the node's housekeeping CPUs change while the claim lives.
	if _, err := b.conn.Exec(ctx, `UPDATE node_resource_slots SET memory_mib = memory_mib - 1024 WHERE id = $1`, b.slotIDs[0]); err != nil {
		t.Fatal(err)
	}
	if err := b.st.InTx(ctx, func(tx *store.Tx) error { return tx.SetHousekeeping(ctx, b.nodeID, []int{192, 193}) }); err != nil {
		t.Fatal(err)
	}
	if n := b.slotsOffTheirDevices(t); n != 0 {
		t.Fatalf("%d slots do not point at a snapshot of their devices after a change", n)
	}
	if n := b.count(t, `SELECT count(*) FROM node_resource_slots s JOIN slot_device_snapshots d ON d.id = s.device_snapshot_id
		WHERE s.node_id = $1 AND d.snapshot->'housekeeping_cpus' = '[192, 193]'`, b.nodeID); n != 8 {
		t.Fatalf("%d of the node's 8 slots have a snapshot with the new housekeeping CPUs", n)
	}
	plan, dispatch = recorded()
	sameJSON("the task plan's snapshots after the slot changed", plan, handed)
	sameJSON("the dispatcher's snapshots after the slot changed", dispatch, handed)
	got, err := b.st.GetAllocation(ctx, rec.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Claims, rec.Claims) {
		t.Errorf("the claims read %+v after the slot changed, were %+v", got.Claims, rec.Claims)
	}

	// A release writes no snapshot, and a second reservation of unchanged slots none either.
	changes := snapshots() - before
	err = b.st.InTx(ctx, func(tx *store.Tx) error {
		locked, tasks, _, err := tx.LockForRelease(ctx, rec.ID, "")
		if err != nil {
			return err
		}
		_, _, err = tx.CancelRequested(ctx, locked, tasks, b.slotIDs[:2], time.Now(), store.AuditRecord{Actor: "test", Action: "allocation.cancel", TargetKind: "allocation", TargetID: rec.ID})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	b.reserve(t, b.slotIDs[2:4])
	if changes != 9 || snapshots()-before != changes {
		t.Errorf("snapshots written: %d by the device changes (want 9: one slot's memory, then the node's 8 slots), %d by a release and a reservation (want 0)",
			changes, snapshots()-before-changes)
	}
}

// The records cannot be rewritten by any path: a snapshot is never changed or removed, a
// claim's record never changes, a slot claim records its slot's current snapshot and no
// other, and a slot pointed at another snapshot is pointed back at its own devices'.
func TestDeviceRecordsCannotBeRewritten(t *testing.T) {
	b := snapshotsSetup(t, "snap-fixed", 61)
	ctx := context.Background()
	rec, _ := b.reserve(t, b.slotIDs[:1])
	_, err := b.conn.Exec(ctx, `UPDATE slot_device_snapshots SET snapshot = '{}'`)
	wantConstraint(t, "changing a snapshot", err, "slot_device_snapshots_append_only")
	_, err = b.conn.Exec(ctx, `DELETE FROM slot_device_snapshots`)
	wantConstraint(t, "deleting a snapshot", err, "slot_device_snapshots_append_only")
	_, err = b.conn.Exec(ctx, `UPDATE allocation_resource_claims SET device_snapshot_id = (SELECT device_snapshot_id FROM node_resource_slots WHERE id = $2)
		WHERE allocation_id = $1`, rec.ID, b.slotIDs[5])
	wantConstraint(t, "pointing a claim at another snapshot", err, "claims_record_fixed")
	_, err = b.conn.Exec(ctx, `UPDATE allocation_resource_claims SET resource_snapshot = '{"pci_address": "elsewhere"}' WHERE allocation_id = $1`, rec.ID)
	wantConstraint(t, "rewriting a claim's snapshot", err, "claims_record_fixed")
	// A rollback's write-back of the copy it refers to (docs/upgrades.md) is the one change allowed.
	if _, err := b.conn.Exec(ctx, `UPDATE allocation_resource_claims c SET resource_snapshot = d.snapshot
		FROM slot_device_snapshots d WHERE d.id = c.device_snapshot_id AND c.resource_snapshot = '{}' AND c.allocation_id = $1`, rec.ID); err != nil {
		t.Fatalf("writing back a claim's copy of its snapshot: %v", err)
	}
	_, err = b.conn.Exec(ctx, `UPDATE allocation_resource_claims SET resource_snapshot = '{}' WHERE allocation_id = $1`, rec.ID)
	wantConstraint(t, "taking a claim's copy away again", err, "claims_record_fixed")

	// A claim on slot 1 naming slot 2's snapshot.
	_, err = b.conn.Exec(ctx, `INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, resource_snapshot, device_snapshot_id)
		SELECT $1, node_id, id, 'slot', '{}', (SELECT device_snapshot_id FROM node_resource_slots WHERE id = $3) FROM node_resource_slots WHERE id = $2`,
		rec.ID, b.slotIDs[1], b.slotIDs[2])
	wantConstraint(t, "a claim recording another slot's devices", err, "claims_record_slot_devices")

	// A claim written without a snapshot (plain SQL) gets its slot's.
	if _, err := b.conn.Exec(ctx, `INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, resource_snapshot)
		SELECT $1, node_id, id, 'slot', '{"pci_address": "made up"}' FROM node_resource_slots WHERE id = $2`, rec.ID, b.slotIDs[1]); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM allocation_resource_claims c JOIN node_resource_slots s ON s.id = c.slot_id
		WHERE c.slot_id = $1 AND c.device_snapshot_id = s.device_snapshot_id AND c.resource_snapshot = '{}'`, b.slotIDs[1]); n != 1 {
		t.Fatal("a claim written without a snapshot does not record its slot's")
	}

	// A slot pointed at another slot's snapshot keeps a snapshot of its own devices.
	if _, err := b.conn.Exec(ctx, `UPDATE node_resource_slots SET device_snapshot_id = (SELECT device_snapshot_id FROM node_resource_slots WHERE id = $2)
		WHERE id = $1`, b.slotIDs[6], b.slotIDs[7]); err != nil {
		t.Fatal(err)
	}
	if n := b.slotsOffTheirDevices(t); n != 0 {
		t.Fatalf("%d slots point at a snapshot that is not of their devices", n)
	}
}

// Claims made before slots kept their snapshots (they carry their own in resource_snapshot,
// with no reference) read as they always did.
func TestClaimsWithTheirOwnSnapshotReadAsBefore(t *testing.T) {
	b := snapshotsSetup(t, "snap-old", 62)
	ctx := context.Background()
	var allocID string
	if err := b.conn.QueryRow(ctx, `INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
		VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 1, 'lab', $2, '{}') RETURNING id::text`, b.tenantID, b.nodeID).Scan(&allocID); err != nil {
		t.Fatal(err)
	}
	// Written as the controller wrote claims before: the snapshot in the row, no reference
	// (the triggers that now fill the reference are what an old row never went through).
	old := `{"slot_id": "` + b.slotIDs[3] + `", "slot_index": 3, "numa_node": 0, "pci_address": "0000:old:00.0",
		"nvme_device": "/dev/old", "fabric_vf_pci_address": "0000:vf:00.2", "mac_address": "52:54:00:00:00:99", "private_ip": "10.9.9.9"}`
	tx, err := b.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, resource_snapshot)
		VALUES ($1, $2, $3, 'slot', $4)`, allocID, b.nodeID, b.slotIDs[3], old); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := b.st.GetAllocation(ctx, allocID, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Claims) != 1 {
		t.Fatalf("claims: %+v", got.Claims)
	}
	c := got.Claims[0]
	if c.SlotIndex == nil || *c.SlotIndex != 3 || c.PCIAddress != "0000:old:00.0" || c.NVMeDevice != "/dev/old" ||
		c.FabricVF != "0000:vf:00.2" || c.MACAddress != "52:54:00:00:00:99" || c.PrivateIP != "10.9.9.9" {
		t.Errorf("an old claim reads %+v, not its own snapshot %s", c, old)
	}
	var plan []json.RawMessage
	if err := b.st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		plan, err = tx.ClaimSnapshots(ctx, allocID)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var g, w any
	if len(plan) != 1 || json.Unmarshal(plan[0], &g) != nil || json.Unmarshal([]byte(old), &w) != nil || !reflect.DeepEqual(g, w) {
		t.Errorf("an old claim's plan snapshot is %s, want %s", plan, old)
	}
}

// The invariants report a slot whose pointer is not a snapshot of its devices and a claim that
// records another slot's, written past the triggers (as rows restored without them could be).
func TestInvariantsReportDeviceRecordsOffTheirSlots(t *testing.T) {
	b := snapshotsSetup(t, "snap-inv", 63)
	ctx := context.Background()
	rec, _ := b.reserve(t, b.slotIDs[:1])
	if bad, err := b.st.Invariants(ctx); err != nil || len(bad) != 0 {
		t.Fatalf("invariants after a reservation: %v %v", bad, err)
	}
	tx, err := b.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE node_resource_slots SET memory_mib = memory_mib - 1 WHERE id = $1`, b.slotIDs[7]); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE allocation_resource_claims SET device_snapshot_id = (SELECT device_snapshot_id FROM node_resource_slots WHERE id = $2)
		WHERE allocation_id = $1`, rec.ID, b.slotIDs[6]); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	bad, err := b.st.Invariants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"slot whose current device snapshot is not of its devices: " + b.slotIDs[7]: false,
		"slot claim recording another slot's devices: " + rec.Claims[0].ID: false}
	for _, v := range bad {
		if _, ok := want[v]; ok {
			want[v] = true
		}
	}
	for v, seen := range want {
		if !seen {
			t.Errorf("invariants %v miss %q", bad, v)
		}
	}
}

// A controller of the previous release reads a claim's own resource_snapshot: while one may
// run (claims_snapshot_by_reference off, as on a database upgraded in service) every new slot
// claim keeps its copy beside the reference, whichever release wrote it; once it is on, the
// controller's claims carry none.
func TestClaimsKeepACopyWhileThePreviousReleaseMayRun(t *testing.T) {
	b := snapshotsSetup(t, "snap-skew", 64)
	ctx := context.Background()
	if _, err := b.conn.Exec(ctx, `UPDATE schema_switches SET enabled = false WHERE name = 'claims_snapshot_by_reference'`); err != nil {
		t.Fatal(err)
	}
	copies := func(allocID string) int {
		return b.count(t, `SELECT count(*) FROM allocation_resource_claims c JOIN slot_device_snapshots d ON d.id = c.device_snapshot_id
			WHERE c.allocation_id = $1 AND c.resource_snapshot = d.snapshot`, allocID)
	}
	rec, _ := b.reserve(t, b.slotIDs[:2])
	if n := copies(rec.ID); n != 2 {
		t.Fatalf("%d of 2 claims carry a copy the previous release can read", n)
	}
	// The previous release's own claims insert, verbatim: its copy stays, the reference is added.
	if _, err := b.conn.Exec(ctx, `WITH c AS (
		INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, fabric_vf_pci_address, resource_snapshot)
		SELECT $1, u.node_id::uuid, nullif(u.slot_id, '')::uuid, u.kind, u.vf, u.snapshot
		FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[]) AS u(node_id, slot_id, kind, vf, snapshot)
		RETURNING slot_id)
		UPDATE node_resource_slots SET status = 'reserved', status_reason = '' WHERE id IN (SELECT slot_id FROM c WHERE slot_id IS NOT NULL)`,
		rec.ID, []string{b.nodeID}, []string{b.slotIDs[2]}, []string{"slot"}, []string{""},
		[]string{`{"slot_id": "` + b.slotIDs[2] + `", "slot_index": 2}`}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM allocation_resource_claims c JOIN node_resource_slots s ON s.id = c.slot_id
		WHERE c.slot_id = $1 AND c.device_snapshot_id = s.device_snapshot_id AND c.resource_snapshot->>'slot_index' = '2'`, b.slotIDs[2]); n != 1 {
		t.Fatal("the previous release's claim lost its copy or got no reference")
	}
	if _, err := b.conn.Exec(ctx, `UPDATE schema_switches SET enabled = true, changed_at = now() WHERE name = 'claims_snapshot_by_reference'`); err != nil {
		t.Fatal(err)
	}
	rec, _ = b.reserve(t, b.slotIDs[4:6])
	if n := copies(rec.ID); n != 0 {
		t.Fatalf("%d claims still carry a copy once the previous release is gone", n)
	}
}
