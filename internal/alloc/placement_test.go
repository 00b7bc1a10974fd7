package alloc_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/store"
)

func eqIdx(t *testing.T, got []int, want ...int) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("slot indexes = %v, want %v", got, want)
	}
}

func TestPlaceOneGPUReservesSlotClaimAndOutbox(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a := b.mustCreate(1)
	if a.Status != "requested" || a.CapacityShape != "gpu_slice" || a.GPUs != 1 {
		t.Fatalf("allocation = %+v", a)
	}
	node, idx := b.placed(a)
	if node != "n1" {
		t.Fatalf("node = %s", node)
	}
	eqIdx(t, idx, 0)
	slots, _ := b.st.ListSlots(b.ctx, mustNode(b, "n1").ID)
	if slots[0].Status != "reserved" || slots[0].AllocationID != a.ID {
		t.Fatalf("slot 0 = %s (alloc %q)", slots[0].Status, slots[0].AllocationID)
	}
	if a.Image == nil || a.Image.Slug != "test-slice-image" || a.Image.DigestSHA256 == "" {
		t.Fatalf("image snapshot = %+v", a.Image)
	}
	if a.Price.GPUHourlyPriceMinor != 450 || a.Price.GPUs != 1 {
		t.Fatalf("price snapshot = %+v", a.Price)
	}
	b.invariants()
}

func mustNode(b *testBundle, name string) apiv1.Node {
	b.t.Helper()
	n, err := b.st.GetNode(b.ctx, name)
	if err != nil {
		b.t.Fatal(err)
	}
	return n
}

func TestFourGPUsTakeAWholeNUMAGroup(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a := b.mustCreate(4)
	_, idx := b.placed(a)
	eqIdx(t, idx, 0, 1, 2, 3)
	full, _ := b.svc.Get(b.ctx, b.admin, a.ID)
	for _, c := range full.Claims {
		if c.NUMANode == nil || *c.NUMANode != 0 {
			t.Fatalf("claim on NUMA %v, want 0", c.NUMANode)
		}
	}
	// The second 4-GPU request takes the other whole group.
	_, idx = b.placed(b.mustCreate(4))
	eqIdx(t, idx, 4, 5, 6, 7)
}

func TestOneGPUAvoidsCleanGroupWhenFragmentedExists(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	b.disable(n, 5) // group 1 (slots 4-7) is fragmented; group 0 is clean
	_, idx := b.placed(b.mustCreate(1))
	eqIdx(t, idx, 4)
	// Filling group 1 before touching group 0: 6, 7 next.
	_, idx = b.placed(b.mustCreate(1))
	eqIdx(t, idx, 6)
}

func TestOneGPUPrefersNodeAlreadyInSliceMode(t *testing.T) {
	b := setup(t)
	b.addNode("a-clean", 1)
	b.addNode("b-busy", 2, withSlots(0, 1, 2, 3))
	first, _, err := b.svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2}, "")
	if err != nil {
		t.Fatal(err)
	}
	node, _ := b.placed(first)
	if node != "b-busy" {
		// a-clean and b-busy are both clean; b-busy's 4-slot group is the tighter best fit
		t.Fatalf("first 2-GPU went to %s, want b-busy (tighter)", node)
	}
	// Now a 1-GPU request must go to b-busy (slice mode) rather than the clean a-clean node.
	node, idx := b.placed(b.mustCreate(1))
	if node != "b-busy" {
		t.Fatalf("1-GPU went to %s, want b-busy (already in slice mode)", node)
	}
	eqIdx(t, idx, 2)
}

func TestTwoGPUsPreferBestFitGroup(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	b.disable(n, 0)    // group 0: 3 free (1,2,3)
	b.disable(n, 4, 5) // group 1: 2 free (6,7)
	_, idx := b.placed(b.mustCreate(2))
	eqIdx(t, idx, 6, 7)
}

func TestTwoGPUsSpanGroupsWhenNoGroupFits(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	b.disable(n, 1, 2, 3, 5, 6, 7) // one free slot per group
	_, idx := b.placed(b.mustCreate(2))
	eqIdx(t, idx, 0, 4)
}

func TestFourGPUsNeverSpanGroups(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	b.disable(n, 0, 4) // 3 + 3 free
	_, err := b.create(b.tenant, "h200-sxm-slice", 4)
	reason, d := unavailableReason(t, err)
	if reason != apiv1.ReasonTopologyFragmented {
		t.Fatalf("reason = %s", reason)
	}
	if d["free_slots"] != 6 || d["max_group_free"] != 3 {
		t.Fatalf("details = %v", d)
	}
}

func TestTopologyFragmentedAcrossNodes(t *testing.T) {
	b := setup(t)
	n1 := b.addNode("n1", 1)
	n2 := b.addNode("n2", 2)
	b.disable(n1, 0, 1, 2, 4, 5, 6) // 2 free, one per group
	b.disable(n2, 0, 1, 2, 4, 5, 6)
	_, err := b.create(b.tenant, "h200-sxm-slice", 4)
	reason, d := unavailableReason(t, err)
	if reason != apiv1.ReasonTopologyFragmented || d["free_slots"] != 4 || d["max_node_free"] != 2 {
		t.Fatalf("reason %s details %v", reason, d)
	}
}

func TestEightGPUsTakeAFullHost(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	b.addNode("n2", 2)
	b.mustCreate(1) // n1 loses slot 0
	node, idx := b.placed(b.mustCreate(8))
	if node != "n2" {
		t.Fatalf("8 GPUs on %s", node)
	}
	eqIdx(t, idx, 0, 1, 2, 3, 4, 5, 6, 7)
	// n1 has 7 free slots: not a full host.
	_, err := b.create(b.tenant, "h200-sxm-slice", 8)
	if r, d := unavailableReason(t, err); r != apiv1.ReasonNoCapacity || d["free_slots"] != 7 {
		t.Fatalf("reason = %s %v", r, d)
	}
	// With 8 free slots spread over two nodes, 8 GPUs are topology-fragmented.
	b.addNode("n3", 3, withSlots(0))
	_, err = b.create(b.tenant, "h200-sxm-slice", 8)
	if r, d := unavailableReason(t, err); r != apiv1.ReasonTopologyFragmented || d["free_slots"] != 8 {
		t.Fatalf("reason = %s %v", r, d)
	}
}

func TestThreeGPUsCountNotAllowed(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	_, err := b.create(b.tenant, "h200-sxm-slice", 3)
	r, d := unavailableReason(t, err)
	if r != apiv1.ReasonCountNotAllowed || d["requested"] != 3 {
		t.Fatalf("reason %s details %v", r, d)
	}
}

// Two enabled slots of a node never share a fabric VF: the database refuses such a map, naming
// both slots. Placement still keeps out a pair written before that constraint
// existed (written here with the session's triggers off).
func TestDuplicateFabricVFExcluded(t *testing.T) {
	b := setup(t)
	vf := "0000:1a:00.2"
	err := b.st.InTx(b.ctx, func(tx *store.Tx) error {
		n, err := tx.CreateNode(b.ctx, apiv1.NodeCreate{Name: "n0", Region: "lab", SliceSKU: "h200-sxm-slice"})
		if err != nil {
			return err
		}
		m := fixtures.H200SlotMap(2)[:2]
		m[1].CapacityMetadata["fabric_vf_pci_address"] = m[0].CapacityMetadata["fabric_vf_pci_address"]
		_, err = tx.ApplySlots(b.ctx, n.ID, m, false)
		return err
	})
	if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "is already held by slot") ||
		!strings.Contains(err.Error(), "slot 0 on node n0") || !strings.Contains(err.Error(), "slot 1 on node n0") {
		t.Fatalf("a map with two slots on one VF: %v; want a conflict naming slots 0 and 1 of n0", err)
	}
	n := b.addNode("n1", 1, withSlots(0, 1))
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	if _, err := conn.Exec(b.ctx, `SET session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(b.ctx, `UPDATE node_resource_slots SET capacity_metadata = jsonb_set(capacity_metadata, '{fabric_vf_pci_address}', to_jsonb($2::text))
		WHERE node_id = $1 AND slot_index = 1`, n.ID, vf); err != nil {
		t.Fatal(err)
	}
	_, err = b.create(b.tenant, "h200-sxm-slice", 1)
	r, d := unavailableReason(t, err)
	if r != apiv1.ReasonFabricPolicyBlocked || d["blocked_by_fabric_policy"] != 2 {
		t.Fatalf("reason %s details %v", r, d)
	}
}

func TestSlotWithoutFabricVFExcluded(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0, 1), editSlot(0, func(s *apiv1.SlotSpec) { delete(s.CapacityMetadata, "fabric_vf_pci_address") }))
	_, idx := b.placed(b.mustCreate(1))
	eqIdx(t, idx, 1)
	_, err := b.create(b.tenant, "h200-sxm-slice", 1)
	if r, _ := unavailableReason(t, err); r != apiv1.ReasonFabricPolicyBlocked {
		t.Fatalf("reason = %s", r)
	}
}

func TestSharedHostFabricModeExcluded(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0), editSlot(0, func(s *apiv1.SlotSpec) { s.CapacityMetadata["fabric_claim_mode"] = "shared_host" }))
	_, err := b.create(b.tenant, "h200-sxm-slice", 1)
	if r, _ := unavailableReason(t, err); r != apiv1.ReasonFabricPolicyBlocked {
		t.Fatalf("reason = %s", r)
	}
}

func TestMountedShareStorageExcluded(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0, 1), editSlot(0, func(s *apiv1.SlotSpec) { s.CapacityMetadata["storage_ownership"] = "host_share" }))
	_, idx := b.placed(b.mustCreate(1))
	eqIdx(t, idx, 1)
	_, err := b.create(b.tenant, "h200-sxm-slice", 1)
	r, d := unavailableReason(t, err)
	if r != apiv1.ReasonNoCapacity || d["blocked_by_storage_policy"] != 1 {
		t.Fatalf("reason %s details %v", r, d)
	}
}

func TestMissingWipePolicyExcluded(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0), editSlot(0, func(s *apiv1.SlotSpec) { s.CapacityMetadata["destructive_wipe_policy"] = "" }))
	_, err := b.create(b.tenant, "h200-sxm-slice", 1)
	if r, _ := unavailableReason(t, err); r != apiv1.ReasonNoCapacity {
		t.Fatalf("reason = %s", r)
	}
}

func TestIncompleteIdentityExcluded(t *testing.T) {
	for name, edit := range map[string]func(*apiv1.SlotSpec){
		"no pci":  func(s *apiv1.SlotSpec) { s.PCIAddress = "" },
		"no nvme": func(s *apiv1.SlotSpec) { s.NVMeDevice = "" },
		"no mac":  func(s *apiv1.SlotSpec) { s.MACAddress = "" },
		"no ip":   func(s *apiv1.SlotSpec) { s.PrivateIP = "" },
	} {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			b.addNode("n1", 1, withSlots(0), editSlot(0, edit))
			if _, err := b.create(b.tenant, "h200-sxm-slice", 1); err == nil {
				t.Fatal("placed on an incomplete slot")
			}
		})
	}
}

func TestFractionalAndChildSlotsIgnored(t *testing.T) {
	half, two := 500, 2
	parent := 0
	for name, edit := range map[string]func(*apiv1.SlotSpec){
		"mig sharing":  func(s *apiv1.SlotSpec) { s.SharingModel = "mig_partition" },
		"max_claims 2": func(s *apiv1.SlotSpec) { s.MaxClaims = &two },
		"half compute": func(s *apiv1.SlotSpec) { s.ComputeMilli = &half },
		"has parent":   func(s *apiv1.SlotSpec) { s.ParentSlotIndex = &parent },
	} {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			b.addNode("n1", 1, withSlots(0, 1), editSlot(1, edit), editSlot(0, func(s *apiv1.SlotSpec) { s.CapacityMetadata["storage_ownership"] = "unassigned" }))
			if _, err := b.create(b.tenant, "h200-sxm-slice", 1); err == nil {
				t.Fatal("placed on a fractional/child slot")
			}
		})
	}
}

func TestDrainingNodeSkipped(t *testing.T) {
	b := setup(t)
	b.addNode("a-drain", 1)
	b.addNode("b-ok", 2, withSlots(0))
	b.tx(func(tx *store.Tx) error { _, err := tx.SetDraining(b.ctx, "a-drain", true); return err })
	node, _ := b.placed(b.mustCreate(1))
	if node != "b-ok" {
		t.Fatalf("placed on %s", node)
	}
	_, err := b.create(b.tenant, "h200-sxm-slice", 1)
	r, d := unavailableReason(t, err)
	if r != apiv1.ReasonNodeDraining || d["on_draining_nodes"] != 8 {
		t.Fatalf("reason %s details %v", r, d)
	}
}

func TestRegionFilter(t *testing.T) {
	b := setup(t)
	b.addNode("east-1", 1, withRegion("east"))
	b.addNode("west-1", 2, withRegion("west"))
	a, _, err := b.svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1, Region: "west"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if node, _ := b.placed(a); node != "west-1" || a.Region != "west" {
		t.Fatalf("placed on %s region %s", node, a.Region)
	}
	_, _, err = b.svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1, Region: "north"}, "")
	if r, _ := unavailableReason(t, err); r != apiv1.ReasonNoCapacity {
		t.Fatalf("reason = %s", r)
	}
}

func TestTenantBoundary(t *testing.T) {
	b := setup(t)
	b.addNode("private-acme", 1, withTenant(b.tenant.TenantID))
	if _, err := b.create(b.other, "h200-sxm-slice", 1); err == nil {
		t.Fatal("globex placed on acme's private node")
	}
	if node, _ := b.placed(b.mustCreate(1)); node != "private-acme" {
		t.Fatalf("acme placed on %s", node)
	}
}

// An admin explains a placement as a tenant would get it (its private node included); a tenant
// may name only itself; a tenant id that is not one is a clear refusal.
func TestAdminExplainsAsATenant(t *testing.T) {
	b := setup(t)
	b.addNode("private-acme", 1, withTenant(b.tenant.TenantID))
	req := apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 1}
	if ex, err := b.svc.Explain(b.ctx, b.admin, req); err != nil || ex.Feasible {
		t.Fatalf("admin, no tenant: %+v %v (the only node is acme's)", ex, err)
	}
	req.TenantID = b.tenant.TenantID
	if ex, err := b.svc.Explain(b.ctx, b.admin, req); err != nil || !ex.Feasible || ex.Choices[0].NodeName != "private-acme" {
		t.Fatalf("admin as acme: %+v %v", ex, err)
	}
	if _, err := b.svc.Explain(b.ctx, b.other, req); err == nil {
		t.Fatal("globex explained a placement as acme")
	}
	req.TenantID = "acme"
	if _, err := b.svc.Explain(b.ctx, b.admin, req); err == nil || !strings.Contains(err.Error(), "not a tenant id") {
		t.Fatalf("bad tenant id: %v", err)
	}
}

func TestStaleHeartbeatExcluded(t *testing.T) {
	b := setupWith(t, alloc.Config{HeartbeatMaxAge: time.Minute})
	fresh := b.addNode("b-fresh", 1, withSlots(0))
	stale := b.addNode("a-stale", 2)
	if err := b.st.RecordHeartbeats(b.ctx, []store.HeartbeatRecord{{NodeID: fresh.ID, At: time.Now()},
		{NodeID: stale.ID, At: time.Now().Add(-10 * time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	if node, _ := b.placed(b.mustCreate(1)); node != "b-fresh" {
		t.Fatalf("placed on %s", node)
	}
	if _, err := b.create(b.tenant, "h200-sxm-slice", 1); err == nil {
		t.Fatal("placed on a node with a stale heartbeat")
	}
}

func TestNoViableImage(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	b.tx(func(tx *store.Tx) error { return tx.RetireImage(b.ctx, "test-slice-image") })
	_, err := b.create(b.tenant, "h200-sxm-slice", 1)
	if r, _ := unavailableReason(t, err); r != apiv1.ReasonNoImage {
		t.Fatalf("reason = %s", r)
	}
}

func TestPerSlotSKUOverride(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0, 1), editSlot(0, func(s *apiv1.SlotSpec) { s.CapacityMetadata["sku"] = "amd-mi300x-roce-slice" }))
	_, idx := b.placed(b.mustCreate(1))
	eqIdx(t, idx, 1)
}

func TestDeterministicNodeTieBreak(t *testing.T) {
	b := setup(t)
	b.addNode("n-b", 2)
	b.addNode("n-a", 1)
	if node, _ := b.placed(b.mustCreate(1)); node != "n-a" {
		t.Fatalf("placed on %s, want n-a (name tie-break)", node)
	}
}

func TestBaremetalAndSliceExcludeEachOther(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	b.addNode("n2", 2)
	bm, err := b.create(b.tenant, "h200-sxm-baremetal-8g", 8)
	if err != nil {
		t.Fatal(err)
	}
	bmNode, _ := b.placed(bm)
	if bm.CapacityShape != "baremetal" || bm.Profile.Source != alloc.SourceBaremetal {
		t.Fatalf("baremetal allocation = %+v", bm)
	}
	// A slice lands on the other node only.
	sl := b.mustCreate(1)
	slNode, _ := b.placed(sl)
	if slNode == bmNode {
		t.Fatalf("slice placed on the baremetal node %s", bmNode)
	}
	// No node is free for a second baremetal: one is exclusive, the other has a slice.
	_, err = b.create(b.tenant, "h200-sxm-baremetal-8g", 8)
	if r, _ := unavailableReason(t, err); r != apiv1.ReasonNoCapacity {
		t.Fatalf("reason = %s", r)
	}
	// After the slice is released (never provisioned), its node is baremetal-free again.
	if _, err := b.svc.Release(b.ctx, b.tenant, sl.ID); err != nil {
		t.Fatal(err)
	}
	bm2, err := b.create(b.tenant, "h200-sxm-baremetal-8g", 8)
	if err != nil {
		t.Fatal(err)
	}
	if node, _ := b.placed(bm2); node != slNode {
		t.Fatalf("second baremetal on %s", node)
	}
	b.invariants()
}

func TestDatabaseRefusesSliceClaimOnExclusiveNode(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	if _, err := b.create(b.tenant, "h200-sxm-baremetal-8g", 8); err != nil {
		t.Fatal(err)
	}
	slots, _ := b.st.ListSlots(b.ctx, n.ID)
	err := b.st.InTx(b.ctx, func(tx *store.Tx) error {
		_, err := tx.InsertAllocation(b.ctx, store.NewAllocation{TenantID: b.tenant.TenantID, SKU: "h200-sxm-slice",
			CapacityShape: "gpu_slice", GPUs: 1, Region: "lab", NodeID: n.ID, PriceSnapshot: map[string]any{}},
			[]store.NewClaim{{Kind: "slot", NodeID: n.ID, SlotID: slots[0].ID, Snapshot: json.RawMessage(`{}`)}})
		return err
	})
	if err == nil {
		t.Fatal("database accepted a slot claim on a node with a live node_exclusive claim")
	}
}

func TestDatabaseRefusesDoubleBooking(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	a := b.mustCreate(1)
	_ = a
	slots, _ := b.st.ListSlots(b.ctx, n.ID)
	err := b.st.InTx(b.ctx, func(tx *store.Tx) error {
		_, err := tx.InsertAllocation(b.ctx, store.NewAllocation{TenantID: b.tenant.TenantID, SKU: "h200-sxm-slice",
			CapacityShape: "gpu_slice", GPUs: 1, Region: "lab", NodeID: n.ID, PriceSnapshot: map[string]any{}},
			[]store.NewClaim{{Kind: "slot", NodeID: n.ID, SlotID: slots[0].ID, Snapshot: json.RawMessage(`{}`)}})
		return err
	})
	if err == nil {
		t.Fatal("database accepted a second live claim on slot 0")
	}
}

func TestExplainReservesNothing(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	ex, err := b.svc.Explain(b.ctx, b.admin, apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !ex.Feasible || len(ex.Choices) == 0 || fmt.Sprint(ex.Choices[0].SlotIndexes) != "[0 1 2 3]" {
		t.Fatalf("explain = %+v", ex)
	}
	// A tenant hears that and how it fits, with no node, slot or ranking in the answer.
	ex, err = b.svc.Explain(b.ctx, b.tenant, apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 4})
	if err != nil || !ex.Feasible || len(ex.Choices) != 0 || strings.Contains(ex.Message, "n1") ||
		ex.Message != "4 GPUs of h200-sxm-slice fit now on one host, within one NUMA node" {
		t.Fatalf("tenant explain = %+v, %v", ex, err)
	}
	list, _ := b.svc.List(b.ctx, b.tenant, "")
	if len(list) != 0 {
		t.Fatalf("explain created %d allocations", len(list))
	}
	ex, err = b.svc.Explain(b.ctx, b.tenant, apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 3})
	if err != nil || ex.Feasible || ex.Reason != apiv1.ReasonCountNotAllowed {
		t.Fatalf("explain 3 = %+v, %v", ex, err)
	}
}

// Explain carries each slice choice's numbers, not only its prose: the FGD change, the
// look-ahead the ranking used and the tier, the same values its reason states.
func TestExplainShowsTheRankingsNumbers(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	b.addNode("n2", 2)
	b.mustCreate(2)
	b.refreshCapacity()
	ex, err := b.svc.Explain(b.ctx, b.admin, apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 1})
	if err != nil || !ex.Feasible || len(ex.Choices) < 2 {
		t.Fatalf("explain = %+v, %v", ex, err)
	}
	number := func(reason, label string) float64 {
		t.Helper()
		i := strings.Index(reason, label+" ")
		if i < 0 {
			t.Fatalf("reason %q has no %s", reason, label)
		}
		f, err := strconv.ParseFloat(strings.TrimRight(strings.Fields(reason[i+len(label)+1:])[0], ",)"), 64)
		if err != nil {
			t.Fatalf("reason %q: %s: %v", reason, label, err)
		}
		return f
	}
	differ := false
	for i, c := range ex.Choices {
		if c.Lookahead == nil || c.FragmentationDelta == nil || c.Tier < 1 || (i > 0 && c.Tier < ex.Choices[i-1].Tier) || (i == 0 && c.Tier != 1) {
			t.Fatalf("choice %d: %+v: want both numbers and tiers from 1, never decreasing", i, c)
		}
		if got := number(c.Reason, "look-ahead"); math.Abs(got-*c.Lookahead) > 0.0051 {
			t.Errorf("choice %d: lookahead %v, its reason says %v (%s)", i, *c.Lookahead, got, c.Reason)
		}
		if got := number(c.Reason, "fragmentation change"); math.Abs(got-*c.FragmentationDelta) > 0.0051 {
			t.Errorf("choice %d: fragmentation_delta %v, its reason says %v (%s)", i, *c.FragmentationDelta, got, c.Reason)
		}
		differ = differ || math.Abs(*c.Lookahead-*c.FragmentationDelta) > 0.01
	}
	if !differ {
		t.Fatalf("every choice has the same look-ahead as FGD change: %+v; the case cannot tell them apart", ex.Choices)
	}
	// The baremetal SKU's choices are whole nodes: no numbers.
	bm, err := b.svc.Explain(b.ctx, b.admin, apiv1.PlacementRequest{SKU: "h200-sxm-baremetal-8g", GPUs: 8})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range bm.Choices {
		if c.Lookahead != nil || c.FragmentationDelta != nil || c.Tier != 0 {
			t.Fatalf("baremetal choice %+v carries slice numbers", c)
		}
	}
}

func TestCapacityDistinguishesRawFromTopologySafe(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	b.disable(n, 0, 4) // 3+3 free: 6 raw, 0 launchable 4-GPU
	b.addNode("n2", 2, withSlots(0), editSlot(0, func(s *apiv1.SlotSpec) { s.CapacityMetadata["fabric_claim_mode"] = "shared_host" }))
	caps, err := b.svc.Capacity(b.ctx, b.tenant, "h200-sxm-slice", "")
	if err != nil || len(caps) != 1 {
		t.Fatal(caps, err)
	}
	c := caps[0]
	want := map[string]int{"1": 6, "2": 3, "4": 0, "8": 0} // 2-GPU: 1+2, 5+6, then 3+7 spanning groups
	if c.RawFreeSlots != 6 || !reflect.DeepEqual(c.Launchable, want) || c.BlockedByPolicy != 1 {
		t.Fatalf("capacity = %+v", c)
	}
}

func TestFailingHostPrerequisitesExcluded(t *testing.T) {
	b := setup(t)
	bad := b.addNode("a-bad", 1)
	b.addNode("b-good", 2, withSlots(0))
	if err := b.st.RecordHeartbeats(b.ctx, []store.HeartbeatRecord{{NodeID: bad.ID, At: time.Now(),
		Facts: []byte(`{"prerequisites": {"ready": false, "required": true, "failed": ["vfio_pci", "ovs_bridge"]}}`)}}); err != nil {
		t.Fatal(err)
	}
	if node, _ := b.placed(b.mustCreate(1)); node != "b-good" {
		t.Fatalf("placed on %s", node)
	}
	n := mustNode(b, "a-bad")
	_, s := alloc.DeriveMode(n, 0, time.Now())
	if s.Slice || !strings.Contains(strings.Join(s.Reasons, ";"), "host prerequisites failing: vfio_pci, ovs_bridge") {
		t.Fatalf("schedulable = %+v", s)
	}
}
