package dispatch_test

import (
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// The provisioning task carries each slot's own host CPU set in its bundle and the node's
// housekeeping set, so the host pins the VM's vCPUs to its slots' CPUs and its emulator
// threads off them; the reconcile payload's bundles carry the same sets.
func TestProvisionAndReconcileCarryHostCPUSets(t *testing.T) {
	w := setup(t, dispatch.Config{})
	m := fixtures.H200SlotMap(1)
	for _, i := range []int{3, 7} { // the last core of each NUMA node goes to the host
		vcpu := 22
		m[i].VCPUCount = &vcpu
	}
	m[3].HostCPUs, m[7].HostCPUs = "36-46,132-142", "84-94,180-190"
	err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
		if _, err := tx.ApplySlots(w.ctx, w.node.ID, m, false); err != nil {
			return err
		}
		return tx.SetHousekeeping(w.ctx, w.node.ID, []int{191, 95, 47, 143})
	})
	if err != nil {
		t.Fatal(err)
	}
	a := w.allocate(2)
	env := w.poll(time.Second)
	if env == nil || env.Type != task.TypeVMProvision {
		t.Fatalf("envelope = %+v", env)
	}
	p, err := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(env)
	if err != nil {
		t.Fatal(err)
	}
	plan := p.(*task.VMProvision)
	if plan.HousekeepingCPUs != "47,95,143,191" {
		t.Fatalf("housekeeping_cpus = %q; want the node's 47,95,143,191", plan.HousekeepingCPUs)
	}
	want := func(b task.Bundle) string {
		if b.SlotIndex >= 0 && b.SlotIndex < len(m) {
			return m[b.SlotIndex].HostCPUs
		}
		return "?"
	}
	if len(plan.Bundles) != 2 {
		t.Fatalf("bundles = %+v", plan.Bundles)
	}
	for _, b := range plan.Bundles {
		if b.HostCPUs == "" || b.HostCPUs != want(b) {
			t.Fatalf("slot %d bundle host_cpus = %q; want the slot's %q", b.SlotIndex, b.HostCPUs, want(b))
		}
	}
	rec, err := w.d.ReconcilePayload(w.ctx, w.node.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Allocations) != 1 || rec.Allocations[0].AllocationID != a.ID || len(rec.Allocations[0].Bundles) != 2 {
		t.Fatalf("reconcile = %+v", rec)
	}
	for _, b := range rec.Allocations[0].Bundles {
		if b.HostCPUs != want(b) {
			t.Fatalf("reconcile slot %d host_cpus = %q; want %q", b.SlotIndex, b.HostCPUs, want(b))
		}
	}
}
