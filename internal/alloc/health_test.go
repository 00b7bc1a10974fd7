package alloc_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/health"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

func slotOf(b *testBundle, node string, idx int) apiv1.Slot {
	b.t.Helper()
	for _, s := range b.slots(mustNode(b, node).ID) {
		if s.SlotIndex == idx {
			return s
		}
	}
	b.t.Fatalf("no slot %d", idx)
	return apiv1.Slot{}
}

func recordValidation(b *testBundle, node string, idx int, passed bool) {
	b.t.Helper()
	n := mustNode(b, node)
	s := slotOf(b, node, idx)
	b.tx(func(tx *store.Tx) error {
		_, err := tx.RecordValidation(b.ctx, store.ValidationRecord{SlotID: s.ID, NodeID: n.ID, Level: "quick", Passed: passed,
			Checks: []apiv1.ValidationCheck{{Name: "pcie", Passed: passed}}})
		return err
	})
}

// A host's Xid 79 on a slot of a live allocation: the tenant sees the event on its allocation
// (which GPU of its allocation, what happened; no host or device names), the slot is
// quarantined, comes back from release idle but out of sale, is not placed again, and returns
// to sale only after a passed validation and an operator's clear.
func TestHealthEventDuringLiveAllocationReachesTenantAndQuarantinesAtRelease(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0, 1, 2))
	a := b.mustCreate(2)
	if err := b.svc.MarkProvisioning(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.svc.MarkActive(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	n1 := mustNode(b, "n1")
	recorded, errs := b.svc.RecordSignals(b.ctx, n1.ID, []apiv1.HealthSignal{
		{SlotIndex: ptr(1), Source: "kernel", Signal: "xid:79", Detail: "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus",
			Evidence: map[string]any{"pci_address": "0000:1b:00.0"}},
		{SlotIndex: ptr(0), Source: "kernel", Signal: "xid:43"}, // an application fault: ignored
		{SlotIndex: ptr(9), Source: "kernel", Signal: "xid:79"}, // no such slot: refused alone
		{SlotIndex: ptr(0), Source: "kernel", Signal: "xid:bogus"},
	})
	if len(recorded) != 1 || len(errs) != 2 {
		t.Fatalf("recorded %+v, errors %v", recorded, errs)
	}
	got, err := b.svc.Get(b.ctx, b.tenant, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.HealthEvents) != 1 {
		t.Fatalf("the tenant sees one health event, got %+v", got.HealthEvents)
	}
	ev := got.HealthEvents[0]
	if ev.Signal != "xid:79" || ev.HealthAfter != "quarantined" || ev.SlotIndex == nil || *ev.SlotIndex != 1 ||
		ev.NodeName != "" || ev.Evidence != nil || ev.Actor != "" {
		t.Fatalf("tenant's event %+v", ev)
	}
	if strings.Contains(fmt.Sprint(got.HealthEvents), "n1") || strings.Contains(fmt.Sprint(got.HealthEvents), "0000:1b") {
		t.Fatalf("the tenant's view names the host or device: %+v", got.HealthEvents)
	}
	if s := slotOf(b, "n1", 1); s.Health != "quarantined" || s.Status != "active" {
		t.Fatalf("slot 1 = %s/%s", s.Status, s.Health)
	}
	if _, err := b.svc.Release(b.ctx, b.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	full, _ := b.svc.Get(b.ctx, b.admin, a.ID)
	proofs := map[string]alloc.WipeProof{}
	for _, c := range full.Claims {
		proofs[c.SlotID] = b.signed("n1", alloc.WipeProof{Verified: true, Method: "blkdiscard_zero_verify"})
	}
	if err := b.svc.CompleteRelease(b.ctx, a.ID, proofs); err != nil {
		t.Fatal(err)
	}
	if s := slotOf(b, "n1", 1); s.Status != "available" || s.Health != "quarantined" {
		t.Fatalf("after release slot 1 = %s/%s, want wiped but quarantined", s.Status, s.Health)
	}
	if s := slotOf(b, "n1", 0); s.Status != "available" || s.Health != "healthy" {
		t.Fatalf("after release slot 0 = %s/%s, the healthy slot goes back on sale", s.Status, s.Health)
	}
	b.refreshCapacity()
	if _, idx := b.placed(b.mustCreate(2)); len(idx) != 2 || idx[0] != 0 || idx[1] != 2 {
		t.Fatalf("placed on slots %v, want the healthy slots 0 and 2", idx)
	}
	if _, err := b.create(b.tenant, "h200-sxm-slice", 1); err == nil {
		t.Fatal("a request was placed on the quarantined slot")
	}
	if _, err := b.svc.SetSlotHealth(b.ctx, b.admin, n1.ID, 1, false, "replaced the riser"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a clear without a passed validation must be refused, got %v", err)
	}
	recordValidation(b, "n1", 1, true)
	if _, err := b.svc.SetSlotHealth(b.ctx, b.admin, n1.ID, 1, false, "replaced the riser"); err != nil {
		t.Fatal(err)
	}
	if s := slotOf(b, "n1", 1); s.Health != "healthy" {
		t.Fatalf("cleared slot = %s", s.Health)
	}
	b.refreshCapacity()
	if _, idx := b.placed(b.mustCreate(1)); len(idx) != 1 || idx[0] != 1 {
		t.Fatalf("the cleared slot is sold again; placed on %v", idx)
	}
	b.invariants()
}

// A tenant's report on release quarantines every slot the allocation holds, in the release's
// transaction, audited; the tenant sees its report on the allocation. A bad report is refused
// before anything is written.
func TestReleaseWithReportHoldsSlotsForReview(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0, 1, 2))
	a := b.mustCreate(2)
	if err := b.svc.MarkProvisioning(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.svc.MarkActive(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "  ", "line\nbreak", strings.Repeat("x", 501)} {
		var ae *apiv1.Error
		if _, err := b.svc.ReleaseWithReport(b.ctx, b.tenant, a.ID, bad); !errors.As(err, &ae) || ae.Code != apiv1.CodeInvalidRequest {
			t.Fatalf("report %q: want invalid_request, got %v", bad, err)
		}
	}
	if got, _ := b.svc.Get(b.ctx, b.tenant, a.ID); got.Status != "active" {
		t.Fatalf("a refused report released the allocation: %s", got.Status)
	}
	if _, err := b.svc.ReleaseWithReport(b.ctx, b.other, a.ID, "not mine"); err == nil {
		t.Fatal("another tenant reported on an allocation it does not own")
	}
	rel, err := b.svc.ReleaseWithReport(b.ctx, b.tenant, a.ID, "GPU 1 Xid 79 during training")
	if err != nil || rel.Status != "releasing" {
		t.Fatalf("release with report: %s %v", rel.Status, err)
	}
	if len(rel.HealthEvents) != 2 || !strings.Contains(rel.HealthEvents[0].Reason, "GPU 1 Xid 79 during training") {
		t.Fatalf("the tenant sees its report: %+v", rel.HealthEvents)
	}
	_, idx := b.placed(a)
	quarantined := 0
	for _, s := range b.slots(mustNode(b, "n1").ID) {
		if s.Health == "quarantined" {
			quarantined++
			if s.SlotIndex != idx[0] && s.SlotIndex != idx[1] {
				t.Fatalf("slot %d was not the allocation's but is quarantined", s.SlotIndex)
			}
		}
	}
	if quarantined != 2 {
		t.Fatalf("%d slots quarantined, want the allocation's 2", quarantined)
	}
	if n, _ := b.st.GetNode(b.ctx, "n1"); !n.Draining {
		t.Fatal("2 of 3 slots quarantined: the node must be drained")
	}
	entries, err := b.st.ListAudit(b.ctx, store.AuditFilter{Action: "allocation.report"})
	if err != nil || len(entries) != 1 {
		t.Fatalf("audit %v %v", entries, err)
	}
}

// Concurrent creates while slots are quarantined one by one: no claim ever lands on a slot
// after its quarantine. A claim on a quarantined slot is only ever one that was live when the
// quarantine was recorded (the event names its allocation).
func TestConcurrentCreatesNeverLandOnQuarantinedSlot(t *testing.T) {
	b := setup(t)
	for i := range 3 {
		b.addNode(fmt.Sprintf("q%d", i), 60+i)
	}
	nodes := []apiv1.Node{mustNode(b, "q0"), mustNode(b, "q1"), mustNode(b, "q2")}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := range 12 {
				a, err := b.create(b.tenant, "h200-sxm-slice", 1+(g+i)%2)
				if err == nil && i%3 == 0 {
					_, _ = b.svc.Release(b.ctx, b.tenant, a.ID) // requested: slots come straight back
				}
			}
		}(g)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 12 {
			n := nodes[i%3]
			_, _ = b.svc.SetSlotHealth(b.ctx, b.admin, n.ID, i%8, true, fmt.Sprintf("quarantine %d", i))
		}
	}()
	wg.Wait()
	conn := connectTo(b)
	var bad int
	if err := conn.QueryRow(b.ctx, `SELECT count(*) FROM allocation_resource_claims c
		JOIN node_resource_slots s ON s.id = c.slot_id AND s.health = 'quarantined'
		JOIN LATERAL (SELECT e.allocation_id FROM slot_health_events e WHERE e.slot_id = s.id AND e.action = 'quarantine'
		              ORDER BY e.id LIMIT 1) q ON true
		WHERE q.allocation_id IS DISTINCT FROM c.allocation_id
		  AND c.created_at >= (SELECT min(e.at) FROM slot_health_events e WHERE e.slot_id = s.id AND e.action = 'quarantine')`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Fatalf("%d claims landed on slots after their quarantine", bad)
	}
	var quarantined int
	if err := conn.QueryRow(b.ctx, `SELECT count(*) FROM node_resource_slots WHERE health = 'quarantined'`).Scan(&quarantined); err != nil || quarantined != 12 {
		t.Fatalf("%d slots quarantined (%v), want 12", quarantined, err)
	}
	b.invariants()
}

func connectTo(b *testBundle) *pgx.Conn {
	b.t.Helper()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { conn.Close(b.ctx) })
	return conn
}

func ptr[T any](v T) *T { return &v }

// signalsOf turns a host scan's findings into the readings hostd sends.
func signalsOf(fs []health.Finding) []apiv1.HealthSignal {
	var out []apiv1.HealthSignal
	for _, f := range fs {
		out = append(out, apiv1.HealthSignal{PCIAddress: f.PCIAddress, NVMeDevices: f.NVMeAliases, Source: f.Source, Signal: f.Signal,
			Detail: f.Detail, Evidence: f.Evidence})
	}
	return out
}

// A generated 8x H200 host tree with slot 2's GPU link at x8 of x16 and slot 5's GPU reading
// 0xffff: a scan degrades slot 2 and quarantines slot 5, and no other slot. AER non-fatal
// errors rising on slot 6's fabric VF between two scans degrade slot 6 alone; a scan that
// finds nothing new reports nothing (a lasting condition is reported once).
func TestHostTreeScanMarksOnlyTheFailingSlots(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	n1 := mustNode(b, "n1")
	root := t.TempDir()
	spec := fixture.H200()
	spec.GPUs[2].LinkWidth = 8
	spec.GPUs[5].Gone = true
	if err := fixture.Write(root, spec); err != nil {
		t.Fatal(err)
	}
	sc := &health.Scanner{FS: hostfs.New(root)}
	defer sc.Close()
	first := sc.Scan(b.ctx)
	recorded, errs := b.svc.RecordSignals(b.ctx, n1.ID, signalsOf(first))
	if len(errs) != 0 || len(recorded) != 2 {
		t.Fatalf("first scan %+v: recorded %d, errors %v", first, len(recorded), errs)
	}
	want := map[int]string{2: "degraded", 5: "quarantined"}
	for _, s := range b.slots(n1.ID) {
		if w := cmp.Or(want[s.SlotIndex], "healthy"); s.Health != w {
			t.Fatalf("slot %d is %s, want %s", s.SlotIndex, s.Health, w)
		}
	}
	if again := sc.Scan(b.ctx); len(again) != 0 {
		t.Fatalf("nothing changed, yet the scan reports %+v", again)
	}
	vf := filepath.Join(root, "sys/devices/pci0000:00", fixtures.H200Fabric[6][:len(fixtures.H200Fabric[6])-1]+"2")
	if err := os.WriteFile(filepath.Join(vf, "aer_dev_nonfatal"), []byte(fixture.AERFile("NONFATAL", 3)), 0o644); err != nil {
		t.Fatal(err)
	}
	rising := sc.Scan(b.ctx)
	if recorded, errs := b.svc.RecordSignals(b.ctx, n1.ID, signalsOf(rising)); len(errs) != 0 || len(recorded) != 1 {
		t.Fatalf("AER scan %+v: recorded %d, errors %v", rising, len(recorded), errs)
	}
	want[6] = "degraded"
	for _, s := range b.slots(n1.ID) {
		if w := cmp.Or(want[s.SlotIndex], "healthy"); s.Health != w {
			t.Fatalf("after AER: slot %d is %s, want %s", s.SlotIndex, s.Health, w)
		}
	}
}

// The NVMe controllers' own PCI functions are read as GPUs' are, and each reading reaches the
// slot whose disk the controller serves (by its namespace's by-id name): a controller whose
// link trained at x2 of x4 degrades its slot only; AER fatal errors rising on another
// quarantine that slot only; the OS disk's controller belongs to no slot, and its reading is
// refused alone.
func TestNVMeControllerPCIeReadingsReachTheirSlot(t *testing.T) {
	b := setup(t)
	n1 := b.addNode("n1", 1, func(_ *apiv1.NodeCreate, s []apiv1.SlotSpec) []apiv1.SlotSpec {
		for i := range s { // the generated tree's disk i+1 is slot i's
			s[i].NVMeDevice = fmt.Sprintf("/dev/disk/by-id/nvme-eui.0025388b01%06d", s[i].SlotIndex+1)
		}
		return s
	})
	root := t.TempDir()
	spec := fixture.H200()
	spec.Disks[3].LinkWidth = 2
	if err := fixture.Write(root, spec); err != nil {
		t.Fatal(err)
	}
	sc := &health.Scanner{FS: hostfs.New(root)}
	defer sc.Close()
	first := sc.Scan(b.ctx)
	recorded, errs := b.svc.RecordSignals(b.ctx, n1.ID, signalsOf(first))
	if len(errs) != 0 || len(recorded) != 1 || recorded[0].Signal != "pcie:link_downtrained" {
		t.Fatalf("first scan %+v: recorded %+v, errors %v", first, recorded, errs)
	}
	want := map[int]string{3: "degraded"}
	for _, s := range b.slots(n1.ID) {
		if w := cmp.Or(want[s.SlotIndex], "healthy"); s.Health != w {
			t.Fatalf("slot %d is %s, want %s", s.SlotIndex, s.Health, w)
		}
	}
	for _, d := range []fixture.Disk{spec.Disks[6], spec.Disks[8]} { // slot 6's disk and the OS disk
		if err := os.WriteFile(filepath.Join(root, "sys/devices/pci0000:00", d.Addr, "aer_dev_fatal"), []byte(fixture.AERFile("FATAL", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rising := sc.Scan(b.ctx)
	recorded, errs = b.svc.RecordSignals(b.ctx, n1.ID, signalsOf(rising))
	if len(recorded) != 1 || recorded[0].Signal != "pcie:aer_fatal_rising" || len(errs) != 1 || !strings.Contains(errs[0].Error(), "no slot of this node holds it") {
		t.Fatalf("AER scan %+v: recorded %+v, errors %v", rising, recorded, errs)
	}
	want[6] = "quarantined"
	for _, s := range b.slots(n1.ID) {
		if w := cmp.Or(want[s.SlotIndex], "healthy"); s.Health != w {
			t.Fatalf("after AER: slot %d is %s, want %s", s.SlotIndex, s.Health, w)
		}
	}
}

// A SKU with validation policy quick: a slot wiped at release is held (quarantined, pending
// its validation) in the release's own transaction, so it is never on sale unvalidated; the
// hold counts toward no drain and is not shown to the tenant; a passed validation lifts it,
// a failed one keeps the slot quarantined for an operator, and a passed validation does not
// lift a quarantine for a fault.
func TestQuickValidationPolicyHoldsSlotsUntilValidated(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0, 1, 2))
	quick := "quick"
	b.tx(func(tx *store.Tx) error {
		_, err := tx.PatchSKU(b.ctx, "h200-sxm-slice", apiv1.SKUPatch{ValidationPolicy: &quick})
		return err
	})
	a := b.mustCreate(2)
	if err := b.svc.MarkProvisioning(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.svc.MarkActive(b.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.Release(b.ctx, b.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	full, _ := b.svc.Get(b.ctx, b.admin, a.ID)
	proofs := map[string]alloc.WipeProof{}
	for _, c := range full.Claims {
		proofs[c.SlotID] = b.signed("n1", alloc.WipeProof{Verified: true, Method: "blkdiscard_zero_verify"})
	}
	if err := b.svc.CompleteRelease(b.ctx, a.ID, proofs); err != nil {
		t.Fatal(err)
	}
	if _, idx := b.placed(a); len(idx) != 2 || idx[0] != 0 || idx[1] != 1 {
		t.Fatalf("placed on %v, want slots 0 and 1", idx)
	}
	for _, i := range []int{0, 1} {
		if s := slotOf(b, "n1", i); s.Status != "available" || s.Health != "quarantined" {
			t.Fatalf("slot %d after release = %s/%s, want wiped and held", i, s.Status, s.Health)
		}
	}
	if n, _ := b.st.GetNode(b.ctx, "n1"); n.Draining {
		t.Fatal("slots held for validation drained the node")
	}
	if got, _ := b.svc.Get(b.ctx, b.tenant, a.ID); len(got.HealthEvents) != 0 {
		t.Fatalf("the tenant sees the platform's validation hold: %+v", got.HealthEvents)
	}
	pending, err := b.st.PendingValidations(b.ctx, mustNode(b, "n1").ID)
	if err != nil || len(pending) != 2 {
		t.Fatalf("pending validations %d %v", len(pending), err)
	}
	b.refreshCapacity()
	if _, err := b.create(b.tenant, "h200-sxm-slice", 2); err == nil {
		t.Fatal("slots awaiting validation were placed")
	}
	n1 := mustNode(b, "n1")
	record := func(idx int, passed bool) {
		t.Helper()
		s := slotOf(b, "n1", idx)
		if err := b.svc.RecordValidation(b.ctx, store.ValidationRecord{SlotID: s.ID, NodeID: n1.ID, Level: "quick", Passed: passed,
			Checks: []apiv1.ValidationCheck{{Name: "pcie", Passed: passed}}, Summary: "pcie"}); err != nil {
			t.Fatal(err)
		}
	}
	record(0, true)
	record(1, false)
	if s := slotOf(b, "n1", 0); s.Health != "healthy" {
		t.Fatalf("slot 0 after a passed validation = %s", s.Health)
	}
	if s := slotOf(b, "n1", 1); s.Health != "quarantined" || !strings.Contains(s.HealthReason, "validation failed") {
		t.Fatalf("slot 1 after a failed validation = %s (%s)", s.Health, s.HealthReason)
	}
	record(1, true) // a later pass does not lift a quarantine for a failed validation
	if s := slotOf(b, "n1", 1); s.Health != "quarantined" {
		t.Fatalf("slot 1 = %s: a fault's quarantine is an operator's to clear", s.Health)
	}
	b.refreshCapacity()
	if _, idx := b.placed(b.mustCreate(2)); len(idx) != 2 || idx[0] != 0 || idx[1] != 2 {
		t.Fatalf("placed on %v, want the validated slot 0 and the untouched slot 2", idx)
	}
}

// A guest's reading names its GPU by position in its allocation: it reaches that slot and no
// other; a reading for an allocation not on the reporting node, a position past the
// allocation's GPUs, or a guest reading naming a PCI address is refused.
func TestGuestReadingsReachOnlyTheirAllocationsSlots(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1, withSlots(0, 1, 2, 3))
	b.addNode("n2", 2, withSlots(0))
	a := b.mustCreate(2)
	node, idx := b.placed(a)
	if node != "n1" || len(idx) != 2 {
		t.Fatalf("placed on %s %v", node, idx)
	}
	n1, n2 := mustNode(b, "n1"), mustNode(b, "n2")
	recorded, errs := b.svc.RecordSignals(b.ctx, n1.ID, []apiv1.HealthSignal{
		{AllocationID: a.ID, GPUIndex: ptr(1), Source: "guest", Signal: "xid:79"},
		{AllocationID: a.ID, GPUIndex: ptr(2), Source: "guest", Signal: "xid:79"},
		{PCIAddress: "0000:1b:00.0", Source: "guest", Signal: "xid:79"},
	})
	if len(recorded) != 1 || len(errs) != 2 {
		t.Fatalf("recorded %+v, errors %v", recorded, errs)
	}
	if _, errs := b.svc.RecordSignals(b.ctx, n2.ID, []apiv1.HealthSignal{{AllocationID: a.ID, GPUIndex: ptr(0), Source: "guest", Signal: "xid:79"}}); len(errs) != 1 {
		t.Fatalf("another node's host reported on this allocation: %v", errs)
	}
	for _, s := range b.slots(n1.ID) {
		want := "healthy"
		if s.SlotIndex == idx[1] {
			want = "quarantined"
		}
		if s.Health != want {
			t.Fatalf("slot %d is %s, want %s", s.SlotIndex, s.Health, want)
		}
	}
	got, _ := b.svc.Get(b.ctx, b.tenant, a.ID)
	if len(got.HealthEvents) != 1 || got.HealthEvents[0].Source != "guest" {
		t.Fatalf("the tenant sees %+v", got.HealthEvents)
	}
}

// fakeNVMe answers `nvme smart-log` for the generated host tree: a simulated stand-in for
// NVMe firmware, which this machine does not have. Every controller reports the healthy
// nvme-cli JSON of internal/health/testdata, except bad, whose available spare is below its
// threshold; nvidia-smi is not installed.
type fakeNVMe struct{ bad string }

func (f fakeNVMe) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	if name != "nvme" || len(args) < 2 || args[0] != "smart-log" {
		return nil, &hostfs.ExitError{Cmd: name, Code: 127, Stderr: "not installed"}
	}
	b, err := os.ReadFile(filepath.Join("..", "health", "testdata", "smart-log-healthy.json"))
	if err != nil {
		return nil, err
	}
	if args[1] == "/dev/"+f.bad {
		b = []byte(strings.Replace(string(b), `"avail_spare":100`, `"avail_spare":5`, 1))
	}
	return b, nil
}

// An NVMe disk whose SMART log says its spare is below threshold quarantines the slot whose
// disk it is (found by its by-id name), and only that slot; the OS disk maps to no slot.
func TestNVMeSmartLogQuarantinesItsSlot(t *testing.T) {
	b := setup(t)
	// Slot 3's disk is the tree's nvme4 (EUI 0025388b01000004).
	b.addNode("n1", 1, editSlot(3, func(s *apiv1.SlotSpec) { s.NVMeDevice = "/dev/disk/by-id/nvme-eui.0025388b01000004" }))
	n1 := mustNode(b, "n1")
	root := t.TempDir()
	if err := fixture.Write(root, fixture.H200()); err != nil {
		t.Fatal(err)
	}
	sc := &health.Scanner{FS: hostfs.New(root), Run: fakeNVMe{bad: "nvme4"}}
	defer sc.Close()
	fs := sc.Scan(b.ctx)
	if len(fs) != 1 || fs[0].Signal != "nvme:spare_below_threshold" || !slices.Contains(fs[0].NVMeAliases, "/dev/disk/by-id/nvme-eui.0025388b01000004") {
		t.Fatalf("findings %+v", fs)
	}
	recorded, errs := b.svc.RecordSignals(b.ctx, n1.ID, signalsOf(fs))
	if len(recorded) != 1 || len(errs) != 0 {
		t.Fatalf("recorded %+v errors %v", recorded, errs)
	}
	for _, s := range b.slots(n1.ID) {
		want := "healthy"
		if s.SlotIndex == 3 {
			want = "quarantined"
		}
		if s.Health != want {
			t.Fatalf("slot %d is %s, want %s", s.SlotIndex, s.Health, want)
		}
	}
	if again := sc.Scan(b.ctx); len(again) != 0 {
		t.Fatalf("a lasting condition is reported once: %+v", again)
	}
	_, errs = b.svc.RecordSignals(b.ctx, n1.ID, []apiv1.HealthSignal{{NVMeDevices: []string{"/dev/disk/by-id/nvme-eui.0025388b01000000"},
		Source: "nvme", Signal: "nvme:critical_warning"}})
	if len(errs) != 1 {
		t.Fatalf("the OS disk maps to no slot, yet: %v", errs)
	}
}
