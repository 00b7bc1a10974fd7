package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// allocationContent is a create's write-once record at about the size the controller writes:
// a resolved VM profile, an image, a price, a usage basis and two SSH keys.
func allocationContent(b snapshotsBundle, slotIDs []string) store.NewAllocation {
	profile := map[string]any{"name": "h200_x2", "source": "scaled", "derived_from": "h200_x1", "gpu_count": len(slotIDs),
		"vcpu": 44, "memory_mib": 458752, "hugepages": "1GiB", "cpu_pinning": "dedicated", "numa_policy": "strict",
		"disk":    map[string]any{"bus": "nvme", "cache": "none", "io": "native", "size_gib": 3500},
		"network": map[string]any{"model": "virtio", "queues": 8, "mtu": 9000},
		"machine": "q35", "firmware": "ovmf", "iommu": "on", "smbios": strings.Repeat("s", 120)}
	image := map[string]any{"id": "0193a1c4-0000-7000-8000-000000000001", "slug": "ubuntu-24.04-cuda-12.6", "version": "2026.11.1",
		"format": "qcow2", "size_bytes": 7516192768, "url": "https://images.example/ubuntu-24.04-cuda-12.6/2026.11.1/disk.qcow2",
		"digest_sha256": strings.Repeat("ab", 32), "os": "linux", "driver": "550.127.05"}
	price := map[string]any{"gpu_hourly_price_minor": 350, "currency": "USD", "sku": "h200-sxm-slice", "gpus": len(slotIDs)}
	usage := map[string]any{"sku": "h200-sxm-slice", "capacity_shape": "gpu_slice", "gpus": len(slotIDs), "node_id": b.nodeID,
		"slot_ids": slotIDs, "slot_count": len(slotIDs), "gpu_hourly_price_minor": 350, "currency": "USD"}
	keys := []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk0Zm9vYmFyYmF6cXV4cXV1eHF1dXhxdXV4cXV1eHF1 alice@laptop",
		"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKk0Zm9vYmFyYmF6cXV4cXV1eHF1dXhxdXV4cXV1eHF1 alice@ci"}
	return store.NewAllocation{TenantID: b.tenantID, SKU: "h200-sxm-slice", CapacityShape: "gpu_slice", GPUs: len(slotIDs),
		Region: "lab", NodeID: b.nodeID, ProfileName: "h200_x2", ResolvedProfile: profile, ImageSnapshot: image,
		PriceSnapshot: price, UsageSnapshot: usage, SSHPublicKeys: keys}
}

// create places na on slotIDs as the controller does and returns it as read back.
func (b snapshotsBundle) create(t *testing.T, na store.NewAllocation, slotIDs []string) store.AllocationRecord {
	t.Helper()
	ctx := context.Background()
	var rec store.AllocationRecord
	err := b.st.InTx(ctx, func(tx *store.Tx) error {
		locked, err := tx.LockAvailableSlots(ctx, b.nodeID, slotIDs, slotIDs, len(slotIDs), "")
		if err != nil {
			return err
		}
		var claims []store.NewClaim
		for _, l := range locked {
			claims = append(claims, store.NewClaim{Kind: "slot", NodeID: l.NodeID, SlotID: l.ID, FabricVF: l.FabricVF, Snapshot: l.Snapshot})
		}
		rec, _, err = tx.InsertAllocationRecord(ctx, na, claims)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func (b snapshotsBundle) setSwitch(t *testing.T, on bool) {
	t.Helper()
	if _, err := b.conn.Exec(context.Background(), `UPDATE schema_switches SET enabled = $1, changed_at = now()
		WHERE name = 'allocation_snapshots_apart'`, on); err != nil {
		t.Fatal(err)
	}
}

func (b snapshotsBundle) move(t *testing.T, id, to string) {
	t.Helper()
	ctx := context.Background()
	if err := b.st.InTx(ctx, func(tx *store.Tx) error {
		return tx.SetAllocationStatus(ctx, id, to, "", time.Now())
	}); err != nil {
		t.Fatalf("%s -> %s: %v", id, to, err)
	}
}

// An allocation's status changes rewrite a small row: the resolved profile, image, price and
// usage snapshots and the SSH keys live in the allocation's snapshot row, written by the
// create and never touched again (an allocation's update cannot be HOT, so it logs its whole
// new row: 1.3 KiB a status change when the snapshots were in it). Every reader sees the
// content the create was given.
func TestAllocationStatusChangesLeaveItsSnapshotsAlone(t *testing.T) {
	b := snapshotsSetup(t, "alloc-snap", 61)
	ctx := context.Background()
	na := allocationContent(b, b.slotIDs[:2])
	rec := b.create(t, na, b.slotIDs[:2])

	if size := b.count(t, `SELECT pg_column_size(a.*) FROM allocations a WHERE id = $1`, rec.ID); size > 400 {
		t.Fatalf("the allocation's row is %d bytes: each status change logs its snapshots again", size)
	}
	type version struct{ Ctid, Xmin string }
	side := func() version {
		var v version
		if err := b.conn.QueryRow(ctx, `SELECT ctid::text, xmin::text FROM allocation_snapshots WHERE allocation_id = $1`, rec.ID).Scan(&v.Ctid, &v.Xmin); err != nil {
			t.Fatalf("the allocation's snapshot row: %v", err)
		}
		return v
	}
	written := side()
	for _, to := range []string{"provisioning", "active", "releasing", "released"} {
		b.move(t, rec.ID, to)
	}
	if got := side(); got != written {
		t.Fatalf("the status changes rewrote the snapshot row (%+v, was %+v)", got, written)
	}
	got, err := b.st.GetAllocation(ctx, rec.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	wantSnapshots(t, "after its status changes", got, na)
	wantSnapshots(t, "as the create read it back", rec, na)

	for _, q := range []string{`UPDATE allocation_snapshots SET usage_snapshot = '{}' WHERE allocation_id = $1`,
		`DELETE FROM allocation_snapshots WHERE allocation_id = $1`,
		`UPDATE allocation_terms SET price_snapshot = '{}' WHERE id = (SELECT terms_id FROM allocation_snapshots WHERE allocation_id = $1)`,
		`DELETE FROM allocation_terms WHERE id = (SELECT terms_id FROM allocation_snapshots WHERE allocation_id = $1)`} {
		if _, err := b.conn.Exec(ctx, q, rec.ID); err == nil || !strings.Contains(err.Error(), "never changed or removed") {
			t.Fatalf("%s: %v; want it refused", q, err)
		}
	}
	if _, err := b.conn.Exec(ctx, `INSERT INTO allocation_snapshots (allocation_id, terms_id)
		SELECT gen_random_uuid(), terms_id FROM allocation_snapshots WHERE allocation_id = $1`, rec.ID); err == nil {
		t.Fatal("a snapshot row of no allocation was written")
	}

	// The profile, image and price are stored once per content: a second allocation of the
	// same terms writes a snapshot row of its usage basis and keys only.
	terms := b.count(t, `SELECT count(*) FROM allocation_terms`)
	second := allocationContent(b, b.slotIDs[2:4])
	rec2 := b.create(t, second, b.slotIDs[2:4])
	if n := b.count(t, `SELECT count(*) FROM allocation_terms`); n != terms {
		t.Fatalf("%d terms rows after a second allocation of the same terms; want %d", n, terms)
	}
	if n := b.count(t, `SELECT pg_column_size(x.*) FROM allocation_snapshots x WHERE allocation_id = $1`, rec2.ID); n > 700 {
		t.Fatalf("the second allocation's snapshot row is %d bytes: it carries its terms", n)
	}
	got2, err := b.st.GetAllocation(ctx, rec2.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	wantSnapshots(t, "the second allocation of the same terms", got2, second)
}

// wantSnapshots fails unless rec reads the write-once content na was created with.
func wantSnapshots(t *testing.T, when string, rec store.AllocationRecord, na store.NewAllocation) {
	t.Helper()
	for _, c := range []struct {
		name string
		got  json.RawMessage
		want any
	}{{"resolved profile", rec.ResolvedProfile, na.ResolvedProfile}, {"image", rec.ImageSnapshot, na.ImageSnapshot},
		{"price", rec.PriceSnapshot, na.PriceSnapshot}, {"usage", rec.UsageSnapshot, na.UsageSnapshot}} {
		if !sameJSON(t, c.got, c.want) {
			t.Errorf("%s: the %s reads %s; want %v", when, c.name, c.got, c.want)
		}
	}
	if !reflect.DeepEqual(rec.SSHPublicKeys, na.SSHPublicKeys) {
		t.Errorf("%s: the SSH keys read %q; want %q", when, rec.SSHPublicKeys, na.SSHPublicKeys)
	}
}

func apiv1Keys(keys []string) apiv1.Allocation { return apiv1.Allocation{SSHPublicKeys: keys} }

func sameJSON(t *testing.T, got json.RawMessage, want any) bool {
	t.Helper()
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var g, v any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal(w, &v) != nil {
		return false
	}
	return reflect.DeepEqual(g, v)
}

// While the previous release may run (allocation_snapshots_apart off, as on a database
// upgraded in service) a new allocation keeps its snapshots in its own columns too, the same
// content, which is all the previous release reads; with the switch on or off, and for an
// allocation written before the snapshot rows (its columns only), every reader of this
// release reads the same: the allocation and its list entry, the dispatcher's plan, and the
// usage basis a re-placement wrote last.
func TestAllocationsReadTheSameWhereverTheirSnapshotsAre(t *testing.T) {
	b := snapshotsSetup(t, "alloc-snap-skew", 62)
	ctx := context.Background()
	var apart bool
	if err := b.conn.QueryRow(ctx, `SELECT enabled FROM schema_switches WHERE name = 'allocation_snapshots_apart'`).Scan(&apart); err != nil || !apart {
		t.Fatalf("a database migrated with no node starts with allocation_snapshots_apart %v (%v); want on", apart, err)
	}
	b.setSwitch(t, false)
	naOff := allocationContent(b, b.slotIDs[:2])
	off := b.create(t, naOff, b.slotIDs[:2])
	b.setSwitch(t, true)
	naOn := allocationContent(b, b.slotIDs[2:4])
	on := b.create(t, naOn, b.slotIDs[2:4])

	// What the previous release reads: the allocation's own columns.
	var own struct{ profile, image, price, usage json.RawMessage }
	var keys []string
	if err := b.conn.QueryRow(ctx, `SELECT resolved_profile, image_snapshot, price_snapshot, usage_snapshot, ssh_public_keys
		FROM allocations WHERE id = $1`, off.ID).Scan(&own.profile, &own.image, &own.price, &own.usage, &keys); err != nil {
		t.Fatal(err)
	}
	wantSnapshots(t, "the previous release's columns of an allocation made with the switch off",
		store.AllocationRecord{ResolvedProfile: own.profile, ImageSnapshot: own.image, PriceSnapshot: own.price,
			UsageSnapshot: own.usage, Allocation: apiv1Keys(keys)}, naOff)
	if n := b.count(t, `SELECT pg_column_size(a.*) FROM allocations a WHERE id = $1`, on.ID); n > 400 {
		t.Fatalf("with the switch on the allocation's row is %d bytes; want its snapshots left out", n)
	}

	// An allocation written before the snapshot rows: its own columns, no snapshot row.
	old := naOff
	old.UsageSnapshot = map[string]any{"sku": "h200-sxm-slice", "node_id": b.nodeID, "old": true}
	var oldID string
	js := func(v any) []byte { j, _ := json.Marshal(v); return j }
	if err := b.conn.QueryRow(ctx, `INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, status,
			profile_name, resolved_profile, image_snapshot, price_snapshot, usage_snapshot, ssh_public_keys)
		VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 2, 'lab', $2, 'failed', 'h200_x2', $3, $4, $5, $6, $7) RETURNING id::text`,
		b.tenantID, b.nodeID, js(old.ResolvedProfile), js(old.ImageSnapshot), js(old.PriceSnapshot), js(old.UsageSnapshot),
		old.SSHPublicKeys).Scan(&oldID); err != nil {
		t.Fatal(err)
	}

	if bad, err := b.st.Invariants(ctx); err != nil || len(bad) > 0 {
		t.Fatalf("invariants: %v %v", bad, err)
	}

	cases := []struct {
		name, id string
		na       store.NewAllocation
	}{{"made with the switch off", off.ID, naOff}, {"made with the switch on", on.ID, naOn}, {"written before", oldID, old}}
	list, err := b.st.ListAllocations(ctx, store.AllocationFilter{TenantID: b.tenantID})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]store.AllocationRecord{}
	for _, r := range list {
		listed[r.ID] = r
	}
	var plans map[string]store.DispatchInfo
	if err := b.st.InTx(ctx, func(tx *store.Tx) (err error) {
		plans, err = tx.DispatchInfos(ctx, []string{off.ID, on.ID, oldID})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		got, err := b.st.GetAllocation(ctx, c.id, b.tenantID)
		if err != nil {
			t.Fatal(err)
		}
		wantSnapshots(t, "GET of an allocation "+c.name, got, c.na)
		wantSnapshots(t, "the list entry of an allocation "+c.name, listed[c.id], c.na)
		p := plans[c.id]
		wantSnapshots(t, "the dispatcher's plan of an allocation "+c.name, store.AllocationRecord{ResolvedProfile: p.ResolvedProfile,
			ImageSnapshot: p.ImageSnapshot, PriceSnapshot: js(c.na.PriceSnapshot), UsageSnapshot: js(c.na.UsageSnapshot),
			Allocation: apiv1Keys(p.SSHPublicKeys)}, c.na)
	}

	// A re-placement writes the new usage basis into the allocation's own column; every
	// reader takes it over the snapshot row's, which stays as the create wrote it.
	for _, c := range cases[:2] {
		b.move(t, c.id, "provisioning")
		usage := map[string]any{"sku": "h200-sxm-slice", "node_id": b.nodeID, "replaced": c.name}
		if err := b.st.InTx(ctx, func(tx *store.Tx) error { return tx.Replace(ctx, c.id, b.nodeID, usage, nil) }); err != nil {
			t.Fatal(err)
		}
		got, err := b.st.GetAllocation(ctx, c.id, "")
		if err != nil {
			t.Fatal(err)
		}
		want := c.na
		want.UsageSnapshot = usage
		wantSnapshots(t, "an allocation "+c.name+" after a re-placement", got, want)
	}

	// The invariants see an allocation whose two records disagree: the previous release would
	// read another price than this one.
	if _, err := b.conn.Exec(ctx, `UPDATE allocations SET price_snapshot = '{"gpu_hourly_price_minor": 1}' WHERE id = $1`, off.ID); err != nil {
		t.Fatal(err)
	}
	bad, err := b.st.Invariants(ctx)
	if err != nil || !strings.Contains(strings.Join(bad, "\n"), "snapshot columns differ from its snapshot row: "+off.ID) {
		t.Fatalf("invariants %v (%v): want the allocation whose price differs reported", bad, err)
	}
}

// Two creates of the same new terms at once: the second waits for the first's row and, once
// the first commits, uses it (no error, no second row); when the first rolls back, the second
// writes its own.
func TestConcurrentCreatesShareNewTerms(t *testing.T) {
	_, url := open(t)
	ctx := context.Background()
	for _, firstCommits := range []bool{true, false} {
		price := fmt.Sprintf(`{"gpu_hourly_price_minor": %d}`, map[bool]int{true: 1, false: 2}[firstCommits])
		c1, c2 := connect(t, url), connect(t, url)
		tx1, err := c1.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var first int64
		if err := tx1.QueryRow(ctx, `SELECT allocation_terms_id('{"name": "p"}', '{"slug": "i"}', $1)`, price).Scan(&first); err != nil {
			t.Fatal(err)
		}
		var pid2 int
		if err := c2.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid2); err != nil {
			t.Fatal(err)
		}
		type answer struct {
			id  int64
			err error
		}
		done := make(chan answer, 1)
		go func() {
			var a answer
			a.err = c2.QueryRow(ctx, `SELECT allocation_terms_id('{"name": "p"}', '{"slug": "i"}', $1)`, price).Scan(&a.id)
			done <- a
		}()
		waitUntil(t, "the second create to wait for the first's terms", func() bool {
			var waiting bool
			_ = c1.QueryRow(ctx, `SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1`, pid2).Scan(&waiting)
			return waiting
		})
		if firstCommits {
			err = tx1.Commit(ctx)
		} else {
			err = tx1.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		a := <-done
		if a.err != nil || (firstCommits && a.id != first) || (!firstCommits && a.id == first) {
			t.Fatalf("first commits %v: the second create got terms %d (%v); the first's were %d", firstCommits, a.id, a.err, first)
		}
		var rows int
		if err := c1.QueryRow(ctx, `SELECT count(*) FROM allocation_terms WHERE price_snapshot = $1::jsonb`, price).Scan(&rows); err != nil || rows != 1 {
			t.Fatalf("first commits %v: %d terms rows of one content (%v)", firstCommits, rows, err)
		}
	}
}

// waitUntil polls cond until it holds, failing the test after a deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling another session's state; the deadline bounds it
	}
}

// The rollback of docs/upgrades.md: with the switch turned off again, the allocations written
// apart get their record back in their own columns, which is what the previous release reads;
// this release reads the same as before, and the invariants hold.
func TestRollbackFillsTheColumnsOfAllocationsWrittenApart(t *testing.T) {
	b := snapshotsSetup(t, "alloc-snap-back", 65)
	ctx := context.Background()
	na := allocationContent(b, b.slotIDs[:2])
	rec := b.create(t, na, b.slotIDs[:2])
	for _, q := range []string{
		`UPDATE schema_switches SET enabled = false, changed_at = now() WHERE name = 'allocation_snapshots_apart'`,
		`UPDATE allocations a SET resolved_profile = t.resolved_profile, image_snapshot = t.image_snapshot,
			price_snapshot = t.price_snapshot, ssh_public_keys = x.ssh_public_keys,
			usage_snapshot = CASE WHEN a.usage_snapshot = '{}' THEN x.usage_snapshot ELSE a.usage_snapshot END
		  FROM allocation_snapshots x JOIN allocation_terms t ON t.id = x.terms_id
		  WHERE x.allocation_id = a.id AND a.price_snapshot = '{}'`} {
		if _, err := b.conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var own struct{ profile, image, price, usage json.RawMessage }
	var keys []string
	if err := b.conn.QueryRow(ctx, `SELECT resolved_profile, image_snapshot, price_snapshot, usage_snapshot, ssh_public_keys
		FROM allocations WHERE id = $1`, rec.ID).Scan(&own.profile, &own.image, &own.price, &own.usage, &keys); err != nil {
		t.Fatal(err)
	}
	wantSnapshots(t, "the previous release's columns after the rollback", store.AllocationRecord{ResolvedProfile: own.profile,
		ImageSnapshot: own.image, PriceSnapshot: own.price, UsageSnapshot: own.usage, Allocation: apiv1Keys(keys)}, na)
	got, err := b.st.GetAllocation(ctx, rec.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	wantSnapshots(t, "this release after the rollback", got, na)
	if bad, err := b.st.Invariants(ctx); err != nil || len(bad) > 0 {
		t.Fatalf("invariants: %v %v", bad, err)
	}
}
