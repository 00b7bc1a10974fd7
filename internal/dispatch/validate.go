package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
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
	// A run passes at the level asked only when the host ran that level: a burn-in the host
	// reported as a quick run did not boot the validation VM.
	if tr.Status == "succeeded" && out.Level != "" && out.Level != v.Level {
		v.Passed = false
		v.Summary = fmt.Sprintf("the host ran a %s validation, not the %s asked", out.Level, v.Level)
		v.Checks = append(v.Checks, apiv1.ValidationCheck{Name: "level", Passed: false, Detail: v.Summary})
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
// A slot whose burn-in plan cannot be made (no viable image for its SKU) stays held too.
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
		p, err := d.ValidationPayload(ctx, &slots[i])
		if err != nil {
			d.log.Warn("slot held for validation, none queued", "slot", slots[i].ID, "err", err)
			continue
		}
		if _, err := d.QueueTask(ctx, nodeID, task.TypeSlotValidate, p, validationTTL(p)); err != nil {
			return err
		}
	}
	return nil
}

// validationTTL is how long a validation task may wait and run: a burn-in boots a VM.
func validationTTL(p task.SlotValidate) time.Duration {
	if p.Level == "burn-in" {
		return time.Hour
	}
	return 30 * time.Minute
}

// ValidationTTL is validationTTL for the admin route.
func ValidationTTL(p task.SlotValidate) time.Duration { return validationTTL(p) }

// ValidationPayload is the slot.validate payload for a slot at its SKU's level: quick for
// none and quick, burn-in (with the validation VM's plan) for burn-in.
func (d *Dispatcher) ValidationPayload(ctx context.Context, slot *apiv1.Slot) (task.SlotValidate, error) {
	p := validatePayload(slot)
	var policy string
	if err := d.st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		policy, err = tx.SlotValidationPolicy(ctx, slot.ID)
		return err
	}); err != nil {
		return p, err
	}
	if policy != "burn-in" {
		return p, nil
	}
	plan, err := d.burnInPlan(ctx, slot)
	if err != nil {
		return p, err
	}
	p.Level, p.BurnIn = "burn-in", plan
	return p, nil
}

// validatePayload is the quick validation of a slot's GPU and fabric VF.
func validatePayload(slot *apiv1.Slot) task.SlotValidate {
	var md struct {
		VF string `json:"fabric_vf_pci_address"`
	}
	_ = json.Unmarshal(slot.CapacityMetadata, &md)
	return task.SlotValidate{SlotID: slot.ID, Level: "quick", GPUPCI: slot.PCIAddress, FabricVF: md.VF}
}
