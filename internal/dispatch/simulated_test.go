package dispatch_test

import (
	"crypto/x509"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/wipeproof"
)

// provisionAndRelease runs one allocation through the dispatcher with the host's reports:
// provision (its output) and, if the allocation went active, release with a wipe proof of
// method for its slot. It returns the allocation's state after provisioning and after
// release, the failure reason, and the slot's final status and reason.
func (w *world) provisionAndRelease(signer wipeproof.Signer, provision task.ProvisionOutput, method string, simulated bool) (afterProvision, reason, slotStatus, slotReason string) {
	w.t.Helper()
	a := w.allocate(1)
	env := w.poll(time.Second)
	out, _ := json.Marshal(provision)
	if _, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, task.Result{Status: "succeeded", Output: out,
		Phases: []task.Phase{{Name: "lease_acquire", Status: "simulated"}}}); err != nil {
		w.t.Fatal(err)
	}
	got, err := w.svc.Get(w.ctx, alloc.Actor{Role: "admin"}, a.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	afterProvision, reason = got.Status, got.FailureReason
	if got.Status == "active" {
		if _, err := w.svc.Release(w.ctx, w.tenant, a.ID); err != nil {
			w.t.Fatal(err)
		}
	}
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		w.t.Fatal(err)
	}
	rel := w.poll(time.Second)
	if rel == nil || rel.Type != task.TypeVMRelease {
		w.t.Fatalf("release task = %+v", rel)
	}
	p, err := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(rel)
	if err != nil {
		w.t.Fatal(err)
	}
	slot := p.(*task.VMRelease).Bundles[0].SlotID
	// Signed by the node's key like any host's proof: what decides is whether it is simulated.
	proof := signProof(w.t, signer, task.WipeProof{Verified: true, Method: method, Evidence: "as the host reported it"}, slot, w.node.ID, rel.TaskID, a.ID)
	out, _ = json.Marshal(task.ReleaseOutput{Runtime: map[bool]string{true: "sim", false: "libvirt"}[simulated], Simulated: simulated, Released: true,
		Wiped: map[string]task.WipeProof{slot: proof}})
	if _, err := w.d.Result(w.ctx, w.node.ID, rel.TaskID, task.Result{Status: "succeeded", Output: out}); err != nil {
		w.t.Fatal(err)
	}
	slots, err := w.st.ListSlots(w.ctx, w.node.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, s := range slots {
		if s.ID == slot {
			return afterProvision, reason, s.Status, s.StatusReason
		}
	}
	w.t.Fatalf("slot %s not found", slot)
	return
}

// A controller that does not allow simulated hosts never takes the sim runtime's word: a
// provisioning reported simulated (no VM exists) fails the allocation, and a simulated wipe
// proof (no disk was written) leaves the slot cleanup_blocked, never available, even from a
// host the controller placed on as real and that turned sim since.
func TestSimulatedReportsRefusedWithoutTheFlag(t *testing.T) {
	w, signer := simSetup(t, false)
	sim := task.ProvisionOutput{Runtime: "sim", Simulated: true, VMName: "gpuaas-x"}
	st, reason, slot, slotReason := w.provisionAndRelease(signer, sim, "simulated", true)
	if st != "failed" || !strings.Contains(reason, "simulated provisioning refused") {
		t.Fatalf("allocation after a simulated provisioning: %s (%s), want failed, refused as simulated", st, reason)
	}
	if slot != "cleanup_blocked" || !strings.Contains(slotReason, "simulated wipe refused") {
		t.Fatalf("slot after a simulated wipe: %s (%s), want cleanup_blocked, refused as simulated", slot, slotReason)
	}

	// A real provisioning, then a release whose proof alone says simulated.
	real := task.ProvisionOutput{Runtime: "libvirt", VMName: "gpuaas-y"}
	st, _, slot, slotReason = w.provisionAndRelease(signer, real, "simulated", false)
	if st != "active" || slot != "cleanup_blocked" || !strings.Contains(slotReason, "simulated wipe refused") {
		t.Fatalf("real provisioning, simulated proof: allocation %s, slot %s (%s); want active, then cleanup_blocked", st, slot, slotReason)
	}
}

// With --allow-simulated-hosts (demo, soak, bench) the same reports are accepted.
func TestSimulatedReportsAcceptedWithTheFlag(t *testing.T) {
	w, signer := simSetup(t, true)
	sim := task.ProvisionOutput{Runtime: "sim", Simulated: true, VMName: "gpuaas-x"}
	st, reason, slot, slotReason := w.provisionAndRelease(signer, sim, "simulated", true)
	if st != "active" || slot != "available" {
		t.Fatalf("simulated hosts allowed: allocation %s (%s), slot %s (%s); want active, then available", st, reason, slot, slotReason)
	}
}

// simSetup is a world whose dispatcher checks signed proofs (the node enrolled with a
// certificate of a CA it trusts), allowing simulated hosts or not.
func simSetup(t *testing.T, allow bool) (*world, wipeproof.Signer) {
	ca := newCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	w := setup(t, dispatch.Config{AllowSimulated: allow, NodeCA: pool})
	return w, w.enroll(ca, w.node.ID)
}
