package dispatch_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Warm slots through the dispatcher: a release whose verified wipe proof puts a slot back
// on sale queues no staging while its SKU has warm slots off; with them on, the next release
// queues slot.image_stage for that slot (the SKU's default image, after that slot's proof),
// signed like every task, and its result is recorded on the slot.
func TestReleaseOfAWarmSKUStagesItsDefaultImageAfterTheProof(t *testing.T) {
	w, _, signer := signedSetup(t)
	conn, err := pgx.Connect(w.ctx, w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(w.ctx)
	// The host says it decodes the staging task (hostd of this build reports its schemas).
	schemas, _ := json.Marshal(map[string]any{"facts": map[string]any{"task_schemas": task.Schemas()}})
	if _, err := conn.Exec(w.ctx, `UPDATE nodes SET agent_facts = $2 WHERE id = $1`, w.node.ID, schemas); err != nil {
		t.Fatal(err)
	}
	release := func() (slot string) {
		t.Helper()
		allocID, taskID, slot := w.releaseTask()
		proof := signProof(t, signer, task.WipeProof{Verified: true, Method: "blkdiscard_zero_verify"}, slot, w.node.ID, taskID, allocID)
		out, _ := json.Marshal(task.ReleaseOutput{Released: true, Wiped: map[string]task.WipeProof{slot: proof}})
		if _, err := w.d.Result(w.ctx, w.node.ID, taskID, task.Result{Status: "succeeded", Output: out}); err != nil {
			t.Fatal(err)
		}
		return slot
	}

	release()
	if env := w.poll(50 * time.Millisecond); env != nil {
		t.Fatalf("a SKU without warm slots got task %s", env.Type)
	}

	on := true
	if err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
		_, err := tx.PatchSKU(w.ctx, "h200-sxm-slice", apiv1.SKUPatch{WarmSlots: &on})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slot := release()
	env := w.poll(time.Second)
	if env == nil || env.Type != task.TypeImageStage {
		t.Fatalf("after the release of a warm SKU's slot: task %+v, want slot.image_stage", env)
	}
	p, err := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(env)
	if err != nil {
		t.Fatal(err)
	}
	stage := p.(*task.ImageStage)
	proofs, err := w.st.WipeProofs(w.ctx, stage.SlotID, 1)
	if err != nil || len(proofs) != 1 {
		t.Fatalf("proofs: %v %v", proofs, err)
	}
	if stage.Image.Slug != "img" || stage.Device == "" || stage.AfterWipeProof != proofs[0].ID {
		t.Fatalf("staging task %+v; want img on the slot's disk after proof %d", stage, proofs[0].ID)
	}
	var staged []string
	if slots, err := w.st.ListSlots(w.ctx, w.node.ID); err == nil {
		for _, s := range slots {
			if s.StagedImage != nil {
				staged = append(staged, s.ID)
			}
		}
	}
	if len(staged) != 0 {
		t.Fatalf("staged before the host reported: %v", staged)
	}

	out, _ := json.Marshal(task.StageOutput{SlotID: stage.SlotID, DigestSHA256: stage.Image.DigestSHA256, Disk: "/dev/nvme1n1"})
	if _, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, task.Result{Status: "succeeded", Output: out}); err != nil {
		t.Fatal(err)
	}
	slots, err := w.st.ListSlots(w.ctx, w.node.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if s.ID != stage.SlotID {
			continue
		}
		if s.StagedImage == nil || s.StagedImage.ImageID != stage.Image.ID || s.StagedImage.AfterProof != stage.AfterWipeProof {
			t.Fatalf("slot %s after the staging result: %+v", s.ID, s.StagedImage)
		}
		if s.ID == slot {
			return
		}
	}
	t.Fatalf("staged slot %s is not the released slot %s", stage.SlotID, slot)
}
