package alloc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/health"
	"github.com/gpuaas/gpuaas/internal/store"
)

// maxReason is the longest reason or report a caller may give (the database keeps 500).
const maxReason = 500

// checkReason refuses an empty, overlong or control-character reason.
func checkReason(what, r string) error {
	if strings.TrimSpace(r) == "" {
		return invalid("%s must not be empty", what)
	}
	if len([]rune(r)) > maxReason {
		return invalid("%s is at most %d characters", what, maxReason)
	}
	for _, c := range r {
		if unicode.IsControl(c) {
			return invalid("%s must be one line of printable text", what)
		}
	}
	return nil
}

func checkReport(r string) error { return checkReason("report", r) }

// reportSlots quarantines the slots an allocation holds on its tenant's report, in the
// release's transaction (the claims are still live, so each event names the allocation).
func reportSlots(ctx context.Context, tx *store.Tx, actor Actor, rec store.AllocationRecord, report string) error {
	var slots []int
	for _, c := range rec.Claims {
		if c.SlotID == "" || c.Status == "released" || c.Status == "failed" || c.NodeID != rec.NodeID {
			continue
		}
		if _, err := tx.RecordHealthEvent(ctx, store.HealthEventRecord{SlotID: c.SlotID, NodeID: c.NodeID, Source: "tenant-report",
			Signal: "tenant:reported", Action: "quarantine", Reason: "reported by the tenant: " + report,
			Evidence: map[string]any{"report": report, "allocation_id": rec.ID}, Actor: actor.Name}); err != nil {
			return err
		}
		if c.SlotIndex != nil {
			slots = append(slots, *c.SlotIndex)
		}
	}
	return tx.Audit(ctx, actor.audit("allocation.report", "allocation", rec.ID, map[string]any{"report": report, "slots": slots}))
}

var signalSources = map[string]bool{"pcie": true, "nvme": true, "nvidia-smi": true, "kernel": true, "guest": true}

// RecordSignals applies a node's readings through the policy table: each becomes a health
// event with the action its rule names (ignored signals are dropped). A reading naming a slot
// the node does not have, an unknown source or an unknown signal is refused, alone: the others
// are still recorded. It returns what was recorded.
func (s *Service) RecordSignals(ctx context.Context, nodeID string, sigs []apiv1.HealthSignal) ([]apiv1.HealthEvent, []error) {
	var out []apiv1.HealthEvent
	var errs []error
	for _, sg := range sigs {
		rule, err := health.Decide(sg.Signal)
		if err == nil && !signalSources[sg.Source] {
			err = fmt.Errorf("unknown health source %q", sg.Source)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if rule.Action == health.Ignore {
			continue
		}
		// The reason is the policy's words only: tenants see it on their allocation, and a
		// host's detail (a kernel line, a PCI address) names the host's devices.
		reason := rule.Name
		ev := map[string]any{"rule_source": rule.Source, "policy_action": string(rule.Action)}
		if sg.Detail != "" {
			ev["detail"] = sg.Detail
		}
		for k, v := range sg.Evidence {
			ev[k] = v
		}
		name := sg.PCIAddress
		if len(sg.NVMeDevices) > 0 {
			name = sg.NVMeDevices[0]
		}
		if sg.GPUIndex != nil {
			name = fmt.Sprintf("allocation %s GPU %d", sg.AllocationID, *sg.GPUIndex)
		}
		if sg.SlotIndex != nil {
			name = fmt.Sprintf("slot %d", *sg.SlotIndex)
		}
		err = s.st.InTx(ctx, func(tx *store.Tx) error {
			var slotID string
			var err error
			switch {
			case sg.SlotIndex != nil:
				slotID, err = tx.SlotID(ctx, nodeID, *sg.SlotIndex)
			case sg.AllocationID != "" && sg.GPUIndex != nil && sg.Source == "guest":
				slotID, err = tx.SlotOfAllocationGPU(ctx, nodeID, sg.AllocationID, *sg.GPUIndex)
			case sg.Source == "guest":
				return invalid("a guest's reading names its allocation and GPU index")
			case sg.PCIAddress != "":
				slotID, _, err = tx.SlotByDevice(ctx, nodeID, health.NormalizePCI(sg.PCIAddress))
			case len(sg.NVMeDevices) > 0 && len(sg.NVMeDevices) <= 16:
				slotID, err = tx.SlotByDisk(ctx, nodeID, sg.NVMeDevices)
			default:
				return invalid("a reading names neither a slot nor a device")
			}
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no slot of this node holds it")
			}
			if err != nil {
				return err
			}
			e, err := tx.RecordHealthEvent(ctx, store.HealthEventRecord{SlotID: slotID, NodeID: nodeID, Source: sg.Source,
				Signal: sg.Signal, Action: rule.Action.StoredAction(), Reason: reason, Evidence: ev, Actor: "hostd"})
			if err == nil {
				out = append(out, e)
			}
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", name, sg.Signal, err))
		}
	}
	return out, errs
}

// SetSlotHealth is an operator's quarantine (quarantine true) or clear of a node's slot, with
// a reason, audited. The database refuses a clear without a passed validation since the
// quarantine began.
func (s *Service) SetSlotHealth(ctx context.Context, actor Actor, nodeID string, index int, quarantine bool, reason string) (apiv1.HealthEvent, error) {
	if err := checkReason("reason", reason); err != nil {
		return apiv1.HealthEvent{}, err
	}
	action, signal, auditAction := "clear", "operator:clear", "slot.health.clear"
	if quarantine {
		action, signal, auditAction = "quarantine", "operator:quarantine", "slot.health.quarantine"
	}
	var out apiv1.HealthEvent
	err := s.st.InTx(ctx, func(tx *store.Tx) error {
		slotID, err := tx.SlotID(ctx, nodeID, index)
		if err != nil {
			return err
		}
		if out, err = tx.RecordHealthEvent(ctx, store.HealthEventRecord{SlotID: slotID, NodeID: nodeID, Source: "operator",
			Signal: signal, Action: action, Reason: reason, Actor: actor.Name}); err != nil {
			return err
		}
		return tx.Audit(ctx, actor.audit(auditAction, "slot", slotID, map[string]any{"node_id": nodeID, "slot_index": index,
			"reason": reason, "health_before": out.HealthBefore, "health_after": out.HealthAfter}))
	})
	return out, err
}

// PendingValidation is the signal of the quarantine that holds a slot between its release and
// its SKU's validation (docs/health.md): a passed validation lifts it by itself.
const PendingValidation = "validation:pending"

// RecordValidation stores a validation run on a slot (the host's slot.validate result). A
// failed run quarantines the slot (the database does it); a passed one lifts a quarantine
// that was only waiting for it. Any other quarantine stays for an operator to clear.
func (s *Service) RecordValidation(ctx context.Context, v store.ValidationRecord) error {
	return s.st.InTx(ctx, func(tx *store.Tx) error {
		if _, err := tx.RecordValidation(ctx, v); err != nil {
			return err
		}
		if !v.Passed {
			return nil
		}
		sig, err := tx.QuarantineSignal(ctx, v.SlotID)
		if err != nil || sig != PendingValidation {
			return err
		}
		_, err = tx.RecordHealthEvent(ctx, store.HealthEventRecord{SlotID: v.SlotID, NodeID: v.NodeID, Source: "validation",
			Signal: "validation:passed", Action: "clear", Reason: v.Level + " validation passed: " + v.Summary, Actor: "validation"})
		return err
	})
}

// holdForValidation quarantines a slot that has just been wiped, in the same transaction, when
// its SKU's policy asks for a validation before it is sold again; the dispatcher then queues
// the validation, and a passed one lifts the hold (RecordValidation). A slot already
// quarantined for a fault stays as it is: its clear is an operator's.
func holdForValidation(ctx context.Context, tx *store.Tx, slotID string) error {
	policy, err := tx.SlotValidationPolicy(ctx, slotID)
	if err != nil || policy == "none" {
		return err
	}
	if sig, err := tx.QuarantineSignal(ctx, slotID); err != nil || sig != "" {
		return err
	}
	_, err = tx.RecordHealthEvent(ctx, store.HealthEventRecord{SlotID: slotID, Source: "validation", Signal: PendingValidation,
		Action: "quarantine", Reason: "held for its " + policy + " validation after the wipe", Actor: "controller"})
	return err
}
