package dispatch_test

import (
	"crypto/x509"
	"encoding/json"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// A result recorded without its effect on the allocation (the database kept the first of the
// two transactions and lost the second, as an asynchronous standby promoted in between does;
// the host had its answer and does not retry) is applied by the reaper: the provisioning
// allocation becomes active, the releasing one released with its slot back on sale.
func TestReaperAppliesAResultThatNeverMovedItsAllocation(t *testing.T) {
	ca := newCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	w := setup(t, dispatch.Config{NodeCA: pool, ReapplyAfter: 10 * time.Millisecond})
	signer := w.enroll(ca, w.node.ID)
	a := w.allocate(1)
	env := w.poll(time.Second)
	record := func(taskID string, out json.RawMessage) {
		t.Helper()
		err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
			_, _, err := tx.CompleteTask(w.ctx, taskID, w.node.ID, "succeeded", out, json.RawMessage(`[]`), "")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	reap := func(want string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for w.status(a.ID) != want && time.Now().Before(deadline) {
			if err := w.d.Reap(w.ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // until the result is older than ReapplyAfter
		}
		if got := w.status(a.ID); got != want {
			t.Fatalf("allocation = %s after reaping; want %s", got, want)
		}
	}
	record(env.TaskID, nil)
	if st := w.status(a.ID); st != "provisioning" {
		t.Fatalf("allocation = %s; the result alone should not have moved it", st)
	}
	reap("active")

	if _, err := w.svc.Release(w.ctx, w.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		t.Fatal(err)
	}
	rel := w.poll(time.Second)
	if rel == nil || rel.Type != task.TypeVMRelease {
		t.Fatalf("release task = %+v", rel)
	}
	p, err := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(rel)
	if err != nil {
		t.Fatal(err)
	}
	slot := p.(*task.VMRelease).Bundles[0].SlotID
	proof := signProof(t, signer, task.WipeProof{Verified: true, Method: "wipefs+blkdiscard-zeroout"}, slot, w.node.ID, rel.TaskID, a.ID)
	out, _ := json.Marshal(task.ReleaseOutput{Released: true, Wiped: map[string]task.WipeProof{slot: proof}})
	record(rel.TaskID, out)
	if st := w.status(a.ID); st != "releasing" {
		t.Fatalf("allocation = %s; the result alone should not have moved it", st)
	}
	reap("released")
	slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
	if slots[0].Status != "available" {
		t.Fatalf("slot after the reapplied verified wipe = %s", slots[0].Status)
	}
}
