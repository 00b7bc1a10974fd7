package alloc_test

import (
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/store"
)

func slotStatus(b *testBundle, node string, idx int) string {
	b.t.Helper()
	slots, err := b.st.ListSlots(b.ctx, mustNode(b, node).ID)
	if err != nil {
		b.t.Fatal(err)
	}
	for _, s := range slots {
		if s.SlotIndex == idx {
			return s.Status
		}
	}
	b.t.Fatalf("no slot %d", idx)
	return ""
}

func TestLifecycleActiveCostReleaseWithWipeProof(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a := b.mustCreate(2)
	if err := b.svc.MarkProvisioning(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if s := slotStatus(b, "n1", 0); s != "provisioning" {
		t.Fatalf("slot 0 = %s", s)
	}
	if err := b.svc.MarkActive(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	b.clock.now = b.clock.now.Add(90 * time.Minute)
	got, _ := b.svc.Get(b.ctx, b.tenant, a.ID)
	// 2 GPUs x 450 cents x 1.5 h = 1350 cents
	if got.Status != "active" || got.Cost.AccruedMinor != 1350 || got.Cost.BilledSeconds != 5400 {
		t.Fatalf("active allocation = %s cost %+v", got.Status, got.Cost)
	}
	rel, err := b.svc.Release(b.ctx, b.tenant, a.ID)
	if err != nil || rel.Status != "releasing" {
		t.Fatalf("release = %s, %v", rel.Status, err)
	}
	b.clock.now = b.clock.now.Add(time.Hour) // billing stopped at release request
	got, _ = b.svc.Get(b.ctx, b.tenant, a.ID)
	if got.Cost.AccruedMinor != 1350 {
		t.Fatalf("cost kept accruing while releasing: %+v", got.Cost)
	}
	full, _ := b.svc.Get(b.ctx, b.admin, a.ID)
	proofs := map[string]alloc.WipeProof{full.Claims[0].SlotID: b.signed("n1", alloc.WipeProof{Verified: true, Method: "wipefs+blkdiscard-zeroout",
		Evidence: "first 1MiB zero, no signature", DeviceIdentity: "serial:S64ANS0T512345K", FinishedAt: b.clock.now})}
	if err := b.svc.CompleteRelease(b.ctx, a.ID, proofs); err != nil {
		t.Fatal(err)
	}
	if s := slotStatus(b, "n1", 0); s != "available" {
		t.Fatalf("wiped slot = %s", s)
	}
	if s := slotStatus(b, "n1", 1); s != "cleanup_blocked" {
		t.Fatalf("unwiped slot = %s, want cleanup_blocked", s)
	}
	got, _ = b.svc.Get(b.ctx, b.tenant, a.ID)
	if got.Status != "released" || got.ReleasedAt == nil {
		t.Fatalf("allocation = %s", got.Status)
	}
	// The tenant sees how its disks were handed over, and nothing of the host.
	want := "1 disk zeroed (blkdiscard) and verified at " + b.clock.now.UTC().Format(time.RFC3339) +
		"; 1 disk not yet verified wiped (withheld from sale until a verified wipe)"
	if got.Handover != want || strings.Contains(got.Handover, "n1") || strings.Contains(got.Handover, "S64ANS") {
		t.Fatalf("handover = %q, want %q", got.Handover, want)
	}
	// The blocked slot is never offered again: a 4-GPU request cannot use group 0.
	_, idx := b.placed(b.mustCreate(4))
	if !reflect.DeepEqual(idx, []int{4, 5, 6, 7}) {
		t.Fatalf("4-GPU after blocked slot: %v", idx)
	}
	b.invariants()
}

func TestReleaseBeforeProvisioningFreesSlotsAtOnce(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a := b.mustCreate(1)
	rel, err := b.svc.Release(b.ctx, b.tenant, a.ID)
	if err != nil || rel.Status != "released" {
		t.Fatalf("release = %s, %v", rel.Status, err)
	}
	if s := slotStatus(b, "n1", 0); s != "available" {
		t.Fatalf("slot = %s", s)
	}
	again, err := b.svc.Release(b.ctx, b.tenant, a.ID)
	if err != nil || again.Status != "released" {
		t.Fatalf("second release = %s, %v", again.Status, err)
	}
	b.invariants()
}

func TestFailedProvisioningBlocksReuseUntilWiped(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0))
	a := b.mustCreate(1)
	if err := b.svc.MarkProvisioning(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.svc.MarkFailed(b.ctx, a.ID, "image_write_convert: qemu-img exited 1"); err != nil {
		t.Fatal(err)
	}
	got, _ := b.svc.Get(b.ctx, b.tenant, a.ID)
	if got.Status != "failed" || got.FailureReason == "" {
		t.Fatalf("allocation = %+v", got)
	}
	if s := slotStatus(b, "n1", 0); s != "failed" {
		t.Fatalf("slot = %s", s)
	}
	if _, err := b.create(b.tenant, "h200-sxm-slice", 1); err == nil {
		t.Fatal("a failed (unwiped) slot was offered again")
	}
	// Releasing the failed allocation and proving the wipe returns the slot.
	if _, err := b.svc.Release(b.ctx, b.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	full, _ := b.svc.Get(b.ctx, b.admin, a.ID)
	if err := b.svc.CompleteRelease(b.ctx, a.ID, map[string]alloc.WipeProof{full.Claims[0].SlotID: b.signed("n1", alloc.WipeProof{Verified: true, Method: "blkdiscard_zero_verify"})}); err != nil {
		t.Fatal(err)
	}
	if s := slotStatus(b, "n1", 0); s != "available" {
		t.Fatalf("slot after wipe = %s", s)
	}
	b.invariants()
}

func TestInvalidTransitionsRejected(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	a := b.mustCreate(1)
	var ae *apiv1.Error
	if err := b.svc.MarkActive(b.ctx, a.ID); !errors.As(err, &ae) || ae.Code != apiv1.CodeConflict {
		t.Fatalf("requested -> active: %v", err)
	}
	if err := b.svc.CompleteRelease(b.ctx, a.ID, nil); !errors.As(err, &ae) || ae.Code != apiv1.CodeConflict {
		t.Fatalf("complete release of a requested allocation: %v", err)
	}
	// The database refuses what code must never do, even if code tried.
	slots, _ := b.st.ListSlots(b.ctx, n.ID)
	err := b.st.InTx(b.ctx, func(tx *store.Tx) error { return tx.SetSlotStatus(b.ctx, slots[1].ID, "active", "", nil) })
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("available -> active accepted: %v", err)
	}
	err = b.st.InTx(b.ctx, func(tx *store.Tx) error {
		if err := tx.SetSlotStatus(b.ctx, slots[1].ID, "disabled", "", nil); err != nil {
			return err
		}
		if err := tx.SetSlotStatus(b.ctx, slots[1].ID, "available", "", nil); err != nil {
			return err
		}
		if err := tx.SetSlotStatus(b.ctx, slots[1].ID, "cleanup_blocked", "", nil); err != nil {
			return err
		}
		if err := tx.SetSlotStatus(b.ctx, slots[1].ID, "cleanup", "", nil); err != nil {
			return err
		}
		return tx.SetSlotStatus(b.ctx, slots[1].ID, "available", "", nil)
	})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("cleanup -> available without wipe proof accepted: %v", err)
	}
}

func TestTransitionTablesMatchDatabase(t *testing.T) {
	b := setup(t)
	slots, allocs, err := b.st.TransitionTables(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	norm := func(m map[string][]string) map[string][]string {
		out := map[string][]string{}
		for k, v := range m {
			c := append([]string(nil), v...)
			sort.Strings(c)
			out[k] = c
		}
		return out
	}
	if !reflect.DeepEqual(norm(slots), norm(alloc.SlotTransitions)) {
		t.Fatalf("slot transitions differ:\ndb:   %v\ncode: %v", norm(slots), norm(alloc.SlotTransitions))
	}
	if !reflect.DeepEqual(norm(allocs), norm(alloc.AllocationTransitions)) {
		t.Fatalf("allocation transitions differ:\ndb:   %v\ncode: %v", norm(allocs), norm(alloc.AllocationTransitions))
	}
}

func TestTenantIsolation(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a := b.mustCreate(1)
	var ae *apiv1.Error
	if _, err := b.svc.Get(b.ctx, b.other, a.ID); !errors.As(err, &ae) || ae.Code != apiv1.CodeNotFound {
		t.Fatalf("other tenant get: %v", err)
	}
	if _, err := b.svc.Release(b.ctx, b.other, a.ID); !errors.As(err, &ae) || ae.Code != apiv1.CodeNotFound {
		t.Fatalf("other tenant release: %v", err)
	}
	list, _ := b.svc.List(b.ctx, b.other, "")
	if len(list) != 0 {
		t.Fatalf("other tenant lists %d allocations", len(list))
	}
	mine, _ := b.svc.Get(b.ctx, b.tenant, a.ID)
	if mine.NodeID != "" || mine.Claims[0].PCIAddress != "" || mine.Claims[0].PrivateIP == "" {
		t.Fatalf("tenant view leaks host internals or lacks its IP: %+v", mine.Claims[0])
	}
	adminView, _ := b.svc.Get(b.ctx, b.admin, a.ID)
	if adminView.NodeName != "n1" || adminView.Claims[0].PCIAddress == "" {
		t.Fatalf("admin view lacks placement: %+v", adminView)
	}
}

func TestProfileResolutionAndSnapshot(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a := b.mustCreate(2)
	if a.Profile.Name != "h200_2g_48c_128g" || a.Profile.VCPUCount != 48 || a.Profile.MemoryMiB != 131072 {
		t.Fatalf("2-GPU profile = %+v", a.Profile)
	}
	// Admin override with a 1-GPU profile scales it.
	ov, _, err := b.svc.Create(b.ctx, b.admin, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2, Profile: "h200_1g_12c_64g", TenantID: b.tenant.TenantID}, "")
	if err != nil {
		t.Fatal(err)
	}
	if ov.Profile.Source != alloc.SourceAdminOverride || ov.Profile.VCPUCount != 24 {
		t.Fatalf("override profile = %+v", ov.Profile)
	}
	// Tenants cannot override.
	var ae *apiv1.Error
	if _, _, err := b.svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1, Profile: "h200_1g_12c_64g"}, ""); !errors.As(err, &ae) || ae.Code != apiv1.CodeForbidden {
		t.Fatalf("tenant override: %v", err)
	}
	// A later SKU edit does not change the running allocation's snapshot.
	rp := []byte(`{"default_slice_vm_profile":"p1","slice_vm_profiles":{"p1":{"gpu_count":1,"vcpu_count":8,"memory_mib":1024}}}`)
	raw := apiv1.SKUPatch{}
	rm := jsonRaw(rp)
	raw.ResourceProfile = &rm
	b.tx(func(tx *store.Tx) error { _, err := tx.PatchSKU(b.ctx, "h200-sxm-slice", raw); return err })
	again, _ := b.svc.Get(b.ctx, b.tenant, a.ID)
	if again.Profile.VCPUCount != 48 {
		t.Fatalf("snapshot changed after SKU edit: %+v", again.Profile)
	}
	// New allocations see the new default scaled: 2 x p1.
	n2 := b.mustCreate(2)
	if n2.Profile.Name != "p1_x2" || n2.Profile.VCPUCount != 16 || n2.Profile.Source != alloc.SourceScaled {
		t.Fatalf("scaled profile = %+v", n2.Profile)
	}
}

func TestIdempotencyKey(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	req := apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}
	a1, replay1, err := b.svc.Create(b.ctx, b.tenant, req, "key-1")
	if err != nil || replay1 {
		t.Fatalf("first: %v replay=%v", err, replay1)
	}
	a2, replay2, err := b.svc.Create(b.ctx, b.tenant, req, "key-1")
	if err != nil || !replay2 || a2.ID != a1.ID {
		t.Fatalf("replay: %v replay=%v ids %s %s", err, replay2, a1.ID, a2.ID)
	}
	var ae *apiv1.Error
	req.GPUs = 2
	if _, _, err := b.svc.Create(b.ctx, b.tenant, req, "key-1"); !errors.As(err, &ae) || ae.Code != apiv1.CodeIdempotencyReused {
		t.Fatalf("reused key: %v", err)
	}
	// Another tenant may use the same key independently.
	if _, replay, err := b.svc.Create(b.ctx, b.other, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, "key-1"); err != nil || replay {
		t.Fatalf("other tenant same key: %v %v", err, replay)
	}
	list, _ := b.svc.List(b.ctx, b.tenant, "")
	if len(list) != 1 {
		t.Fatalf("tenant has %d allocations, want 1", len(list))
	}
}

// A host's batch of provisioning tasks marks every allocation in one round trip: requested
// ones move to provisioning with their claims and slots (one outbox event each), one already
// provisioning stays (a redelivery), one released before its host took the task is reported
// released so its task is not delivered.
func TestMarkProvisioningManyMovesTheBatchAtOnce(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a1, a2, a3, a4 := b.mustCreate(2), b.mustCreate(1), b.mustCreate(1), b.mustCreate(1)
	if err := b.svc.MarkProvisioning(b.ctx, a3.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.Release(b.ctx, b.tenant, a4.ID); err != nil {
		t.Fatal(err)
	}
	got, err := b.svc.MarkProvisioningMany(b.ctx, []string{a1.ID, a2.ID, a3.ID, a4.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{a1.ID: "provisioning", a2.ID: "provisioning", a3.ID: "provisioning", a4.ID: "released"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	for _, a := range []apiv1.Allocation{a1, a2} {
		full, err := b.svc.Get(b.ctx, b.admin, a.ID)
		if err != nil || full.Status != "provisioning" {
			t.Fatalf("%s: %s, %v", a.ID, full.Status, err)
		}
		for _, c := range full.Claims {
			if c.Status != "provisioning" {
				t.Fatalf("%s: claim on slot %s is %s", a.ID, c.SlotID, c.Status)
			}
			slots, _ := b.st.ListSlots(b.ctx, mustNode(b, "n1").ID)
			for _, s := range slots {
				if s.ID == c.SlotID && s.Status != "provisioning" {
					t.Fatalf("slot %d is %s", s.SlotIndex, s.Status)
				}
			}
		}
	}
	if s := slotStatus(b, "n1", 7); s != "available" {
		t.Fatalf("an unclaimed slot moved: %s", s)
	}
	// Again (a redelivered batch): nothing changes, no new events.
	before := provisioningEvents(b)
	if before != 3 {
		t.Fatalf("%d allocation.provisioning events, want 3 (a3 once by MarkProvisioning, a1 and a2 by the batch)", before)
	}
	if got, err := b.svc.MarkProvisioningMany(b.ctx, []string{a1.ID, a2.ID}); err != nil || got[a1.ID] != "provisioning" {
		t.Fatalf("again: %v, %v", got, err)
	}
	if after := provisioningEvents(b); after != before {
		t.Fatalf("a redelivered batch wrote %d more events", after-before)
	}
	if _, err := b.svc.MarkProvisioningMany(b.ctx, []string{"00000000-0000-0000-0000-000000000001"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unknown allocation: %v, want not found", err)
	}
	if v, err := b.st.Invariants(b.ctx); err != nil || len(v) > 0 {
		t.Fatalf("invariants: %v, %v", v, err)
	}
}

// provisioningEvents counts the allocation.provisioning outbox events waiting for the worker.
func provisioningEvents(b *testBundle) int {
	b.t.Helper()
	n := 0
	b.tx(func(tx *store.Tx) error {
		evs, err := tx.PendingOutbox(b.ctx, 1000)
		for _, e := range evs {
			if e.Topic == "allocation.provisioning" {
				n++
			}
		}
		return err
	})
	return n
}

// Every claim carries its slot's devices, as the slot map gave them, in slot order.
func TestClaimsCarryTheirSlotsDevices(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 7)
	a := b.mustCreate(4)
	got, err := b.svc.Get(b.ctx, b.admin, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Claims) != 4 {
		t.Fatalf("%d claims, want 4", len(got.Claims))
	}
	for i, c := range got.Claims {
		if c.SlotIndex == nil || c.NUMANode == nil {
			t.Fatalf("claim %d lacks its slot index or NUMA node: %+v", i, c)
		}
		want := fixtures.H200Slot(7, *c.SlotIndex)
		if i > 0 && *c.SlotIndex <= *got.Claims[i-1].SlotIndex {
			t.Fatalf("claims out of slot order: %d after %d", *c.SlotIndex, *got.Claims[i-1].SlotIndex)
		}
		if *c.NUMANode != *want.NUMANode || c.PCIAddress != want.PCIAddress || c.NVMeDevice != want.NVMeDevice ||
			c.FabricVF != want.CapacityMetadata["fabric_vf_pci_address"] || c.MACAddress != want.MACAddress || c.PrivateIP != want.PrivateIP ||
			c.Kind != "slot" || c.SlotID == "" || c.NodeID == "" {
			t.Fatalf("claim %d = %+v, want slot %d's devices %+v", i, c, *c.SlotIndex, want)
		}
	}
}

// A failed allocation whose slot was proven wiped and put back on sale (by its cleanup, or
// by an operator's repair wipe) lets go of it: the tenant's later release neither touches
// the slot, now the next allocation's, nor plans a wipe of it, and it finishes released.
func TestReleaseOfACleanedFailedAllocationLeavesItsFormerSlotAlone(t *testing.T) {
	for _, path := range []string{"cleanup", "repair"} {
		t.Run(path, func(t *testing.T) {
			b := setup(t)
			b.addNode("n1", 1, withSlots(0))
			a := b.mustCreate(1)
			if err := b.svc.MarkProvisioning(b.ctx, a.ID); err != nil {
				t.Fatal(err)
			}
			full, _ := b.svc.Get(b.ctx, b.admin, a.ID)
			slot := full.Claims[0].SlotID
			proof := b.signed("n1", alloc.WipeProof{Verified: true, Method: "blkdiscard_zero_verify"})
			if path == "cleanup" {
				if err := b.svc.MarkFailed(b.ctx, a.ID, "image_write_convert: qemu-img exited 1"); err != nil {
					t.Fatal(err)
				}
				if err := b.svc.CleanupFailed(b.ctx, a.ID, map[string]alloc.WipeProof{slot: proof}); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := b.svc.MarkPlanInvalid(b.ctx, a.ID, "disk mounted on the host"); err != nil {
					t.Fatal(err)
				}
				if err := b.svc.RepairSlot(b.ctx, slot, proof); err != nil {
					t.Fatal(err)
				}
			}
			if s := slotStatus(b, "n1", 0); s != "available" {
				t.Fatalf("slot after the failed allocation's %s = %s", path, s)
			}
			next := b.mustCreate(1) // the slot is sold again
			if err := b.svc.MarkProvisioning(b.ctx, next.ID); err != nil {
				t.Fatal(err)
			}
			if err := b.svc.MarkActive(b.ctx, next.ID); err != nil {
				t.Fatal(err)
			}
			rel, err := b.svc.Release(b.ctx, b.tenant, a.ID)
			if err != nil {
				t.Fatalf("release of the cleaned failed allocation: %v", err)
			}
			if s := slotStatus(b, "n1", 0); s != "active" {
				t.Fatalf("the next tenant's slot = %s after the old allocation's release, want active", s)
			}
			var plan map[string]store.DispatchInfo
			b.tx(func(tx *store.Tx) (err error) { plan, err = tx.DispatchInfos(b.ctx, []string{a.ID}); return err })
			if n := len(plan[a.ID].Snapshots); n != 0 {
				t.Fatalf("the old allocation's release plans a wipe of %d slot(s), one of them the next tenant's", n)
			}
			if rel.Status != "released" {
				if err := b.svc.CompleteRelease(b.ctx, a.ID, nil); err != nil {
					t.Fatalf("complete release: %v", err)
				}
			}
			got, _ := b.svc.Get(b.ctx, b.tenant, a.ID)
			if got.Status != "released" {
				t.Fatalf("old allocation = %s, want released", got.Status)
			}
			if s := slotStatus(b, "n1", 0); s != "active" {
				t.Fatalf("the next tenant's slot = %s after the old allocation's release completed, want active", s)
			}
			b.invariants()
		})
	}
}
