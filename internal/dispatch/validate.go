package dispatch

import (
	"context"
	"encoding/json"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/health"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// applyValidation records a slot.validate result as evidence on the slot. A run counts as
// passed only when the task succeeded and every check passed; a task that failed or expired
// is a failed validation (the slot is quarantined), with the host's error as its summary.
func (d *Dispatcher) applyValidation(ctx context.Context, tr store.TaskRecord) error {
	var p task.SlotValidate
	if err := json.Unmarshal(tr.Payload, &p); err != nil {
		return err
	}
	var out health.ValidationResult
	_ = json.Unmarshal(tr.Output, &out)
	v := store.ValidationRecord{SlotID: p.SlotID, NodeID: tr.NodeID, TaskID: tr.ID, Level: p.Level, Checks: out.Checks,
		Passed: tr.Status == "succeeded" && out.Passed && len(out.Checks) > 0, Simulated: out.Simulated, Summary: out.Summary}
	if tr.Status != "succeeded" {
		v.Summary = "validation task " + tr.Status + ": " + tr.Error
		v.Checks = append(v.Checks, apiv1.ValidationCheck{Name: "task", Passed: false, Detail: tr.Error})
	}
	if v.Level == "" {
		v.Level = "quick"
	}
	if err := d.alloc.RecordValidation(ctx, v); err != nil {
		return err
	}
	return d.st.InTx(ctx, func(tx *store.Tx) error {
		return tx.Audit(ctx, store.AuditRecord{Actor: "node:" + tr.NodeID, ActorRole: "node", Action: "slot.validate",
			TargetKind: "slot", TargetID: p.SlotID, Details: map[string]any{"task_id": tr.ID, "passed": v.Passed, "simulated": v.Simulated,
				"summary": v.Summary}})
	})
}

// queueValidations queues a slot.validate for each slot of the node held for its SKU's
// validation after a wipe that has none queued or running. A slot whose task is lost stays
// held (quarantined): it is never sold unvalidated, and `gpuaasctl slots validate` queues one.
func (d *Dispatcher) queueValidations(ctx context.Context, nodeID string) error {
	slots, err := d.st.PendingValidations(ctx, nodeID)
	if err != nil || len(slots) == 0 {
		return err
	}
	busy, err := d.st.SlotsWithLiveTask(ctx, nodeID, string(task.TypeSlotValidate))
	if err != nil {
		return err
	}
	for i := range slots {
		if busy[slots[i].ID] {
			continue
		}
		if _, err := d.QueueTask(ctx, nodeID, task.TypeSlotValidate, validatePayload(&slots[i]), 30*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// validatePayload is the quick validation of a slot's GPU and fabric VF.
func validatePayload(slot *apiv1.Slot) task.SlotValidate {
	var md struct {
		VF string `json:"fabric_vf_pci_address"`
	}
	_ = json.Unmarshal(slot.CapacityMetadata, &md)
	return task.SlotValidate{SlotID: slot.ID, Level: "quick", GPUPCI: slot.PCIAddress, FabricVF: md.VF}
}

// ValidatePayload is the slot.validate payload for a slot (the admin route queues the same).
func ValidatePayload(slot *apiv1.Slot) task.SlotValidate { return validatePayload(slot) }
