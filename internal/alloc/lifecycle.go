package alloc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

func validateSSHKeys(keys []string) error {
	if len(keys) > 16 {
		return invalid("at most 16 SSH public keys")
	}
	for i, k := range keys {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			return invalid("ssh_public_keys[%d] is not an OpenSSH public key: %v", i, err)
		}
		if strings.ContainsAny(k, "\n\r") {
			return invalid("ssh_public_keys[%d] must be a single line", i)
		}
	}
	return nil
}

// tenantScope is the tenant filter for reads: admins see everything.
func tenantScope(a Actor) string {
	if a.isAdmin() {
		return ""
	}
	return a.TenantID
}

// Get returns one allocation as the actor may see it.
func (s *Service) Get(ctx context.Context, actor Actor, id string) (apiv1.Allocation, error) {
	if !store.IsUUID(id) {
		return apiv1.Allocation{}, &apiv1.Error{Code: apiv1.CodeNotFound, Message: "allocation " + id + " not found"}
	}
	rec, tasks, err := s.st.GetAllocationWithTasks(ctx, id, tenantScope(actor))
	if errors.Is(err, store.ErrNotFound) {
		return apiv1.Allocation{}, &apiv1.Error{Code: apiv1.CodeNotFound, Message: "allocation " + id + " not found"}
	}
	if err != nil {
		return apiv1.Allocation{}, err
	}
	out := withTasks(s.present(actor, rec), tasks)
	if out.HealthEvents, err = s.st.AllocationHealthEvents(ctx, id); err != nil {
		return apiv1.Allocation{}, err
	}
	if err := s.explainWaiting(ctx, rec.NodeID, out.Tasks); err != nil {
		return apiv1.Allocation{}, err
	}
	if rec.Status == AllocReleased || rec.Status == AllocFailed {
		proofs, err := s.st.AllocationWipeProofs(ctx, id)
		if err != nil {
			return apiv1.Allocation{}, err
		}
		out.Handover = HandoverSummary(proofs)
	}
	return out, nil
}

// explainWaiting says, on each queued task its node's hostd does not decode, which release
// it needs (the host's facts are read only when a task is queued).
func (s *Service) explainWaiting(ctx context.Context, nodeID string, tasks []apiv1.AllocationTask) error {
	var facts json.RawMessage
	for i := range tasks {
		if tasks[i].Status != "queued" {
			continue
		}
		if facts == nil {
			n, err := s.st.GetNode(ctx, nodeID)
			if err != nil {
				return err
			}
			facts = append(json.RawMessage{}, n.AgentFacts...)
		}
		tasks[i].Waiting = task.WaitReason(facts, tasks[i].Type, tasks[i].SchemaVersion)
	}
	return nil
}

// withTasks adds an allocation's host tasks (read newest first) to its view, oldest first.
func withTasks(out apiv1.Allocation, tasks []store.TaskRecord) apiv1.Allocation {
	for i := len(tasks) - 1; i >= 0; i-- {
		tr := tasks[i]
		out.Tasks = append(out.Tasks, apiv1.AllocationTask{ID: tr.ID, Type: tr.Type, Status: tr.Status, Attempt: tr.Attempt,
			Error: tr.Error, CreatedAt: tr.CreatedAt, Phases: tr.Phases, SchemaVersion: tr.SchemaVersion})
	}
	return out
}

// List returns the actor's allocations (all for admins).
func (s *Service) List(ctx context.Context, actor Actor, status string) ([]apiv1.Allocation, error) {
	if status != "" {
		if _, ok := AllocationTransitions[status]; !ok && status != AllocReleased {
			return nil, invalid("unknown status %q", status)
		}
	}
	recs, err := s.st.ListAllocations(ctx, store.AllocationFilter{TenantID: tenantScope(actor), Status: status})
	if err != nil {
		return nil, err
	}
	out := make([]apiv1.Allocation, 0, len(recs))
	for _, r := range recs {
		out = append(out, s.present(actor, r))
	}
	return out, nil
}

// present turns a record into the API view: placement internals only for admins.
func (s *Service) present(actor Actor, rec store.AllocationRecord) apiv1.Allocation {
	a := rec.Allocation
	_ = json.Unmarshal(rec.ResolvedProfile, &a.Profile)
	_ = json.Unmarshal(rec.PriceSnapshot, &a.Price)
	var img apiv1.ImageRef
	if json.Unmarshal(rec.ImageSnapshot, &img) == nil && img.ID != "" {
		a.Image = &img
	}
	a.Cost = Cost(a.Price, a.ActiveAt, a.ReleasingAt, s.cfg.Now())
	a.Node, a.Slots = a.NodeName, []apiv1.AllocationSlot{}
	for _, c := range a.Claims {
		// The current placement's slots (claims a re-placement gave up are on other nodes).
		if c.Kind == "slot" && c.SlotIndex != nil && c.NodeID == a.NodeID {
			a.Slots = append(a.Slots, apiv1.AllocationSlot{SlotIndex: *c.SlotIndex, NUMANode: c.NUMANode, Status: c.Status, MACAddress: c.MACAddress, PrivateIP: c.PrivateIP})
		}
	}
	if !actor.isAdmin() {
		if a.NodeID != "" {
			h := sha256.Sum256([]byte(a.TenantID + "/" + a.NodeID))
			a.Node = "host-" + hex.EncodeToString(h[:6])
		}
		a.NodeID, a.NodeName = "", ""
		for i := range a.Claims {
			c := &a.Claims[i]
			// Tenants see their VM's addresses and NUMA placement (as in slots) but not host
			// PCI/NVMe identities.
			a.Claims[i] = apiv1.Claim{ID: c.ID, Kind: c.Kind, Status: c.Status, SlotIndex: c.SlotIndex, NUMANode: c.NUMANode,
				MACAddress: c.MACAddress, PrivateIP: c.PrivateIP, CreatedAt: c.CreatedAt}
		}
	}
	return a
}

// Cost computes accrued usage from active_at until release was requested (or now), rounded
// to the nearest minor unit. Billing starts when the allocation is usable.
func Cost(p apiv1.Price, activeAt, releasingAt *time.Time, now time.Time) apiv1.Cost {
	c := apiv1.Cost{Currency: p.Currency}
	if activeAt == nil {
		return c
	}
	end := now
	if releasingAt != nil {
		end = *releasingAt
	}
	secs := int64(end.Sub(*activeAt) / time.Second)
	if secs < 0 {
		secs = 0
	}
	c.BilledSeconds = secs
	c.AccruedMinor = (p.GPUHourlyPriceMinor*int64(p.GPUs)*secs + 1800) / 3600
	return c
}

// Release starts releasing an allocation. A reservation that never reached provisioning is
// finished at once (no device or disk was touched, so its slots return to available);
// otherwise the allocation and its slots move to releasing and the host is asked to tear
// down and wipe (outbox allocation.release_requested). Releasing twice is a no-op.
func (s *Service) Release(ctx context.Context, actor Actor, id string) (apiv1.Allocation, error) {
	return s.release(ctx, actor, id, "")
}

// ReleaseWithReport releases an allocation whose tenant reports a problem with it: in the same
// transaction each slot it holds is quarantined with the report as its reason, held for an
// operator's review (docs/health.md).
func (s *Service) ReleaseWithReport(ctx context.Context, actor Actor, id, report string) (apiv1.Allocation, error) {
	if err := checkReport(report); err != nil {
		return apiv1.Allocation{}, err
	}
	return s.release(ctx, actor, id, report)
}

func (s *Service) release(ctx context.Context, actor Actor, id, report string) (apiv1.Allocation, error) {
	if !store.IsUUID(id) {
		return apiv1.Allocation{}, &apiv1.Error{Code: apiv1.CodeNotFound, Message: "allocation " + id + " not found"}
	}
	now := s.cfg.Now()
	var done *apiv1.Allocation // released at once: the allocation as written
	err := s.st.InTx(ctx, func(tx *store.Tx) error {
		done = nil
		// Locked and read; a requested one's queued tasks cancelled (they must never run).
		rec, tasks, leased, err := tx.LockForRelease(ctx, id, tenantScope(actor))
		if errors.Is(err, store.ErrNotFound) {
			return &apiv1.Error{Code: apiv1.CodeNotFound, Message: "allocation " + id + " not found"}
		}
		if err != nil {
			return err
		}
		if report != "" {
			if err := reportSlots(ctx, tx, actor, rec, report); err != nil {
				return err
			}
		}
		switch rec.Status {
		case AllocReleasing, AllocReleased:
			return nil
		case AllocRequested:
			if leased { // its host has the plan: release through the host, with the wipe
				if err := s.beginRelease(ctx, tx, rec, now); err != nil {
					return err
				}
				break
			}
			// Nothing reached the host: the slots go straight back (one round trip).
			var slots []string
			for _, c := range rec.Claims {
				if c.SlotID != "" && c.Status != "released" { // released: given up by a re-placement
					slots = append(slots, c.SlotID)
				}
			}
			written, tasks, err := tx.CancelRequested(ctx, rec, tasks, slots, now, actor.audit("allocation.release", "allocation", id, map[string]any{"from_status": rec.Status}))
			// The answer is what was written, unless a report recorded health events: those
			// are shown as Get reads them (a rare release, read again after it commits).
			if err == nil && report == "" {
				out := withTasks(s.present(actor, written), tasks)
				done = &out
			}
			return err
		default: // provisioning, active, failed
			if err := s.beginRelease(ctx, tx, rec, now); err != nil {
				return err
			}
		}
		return tx.Audit(ctx, actor.audit("allocation.release", "allocation", id, map[string]any{"from_status": rec.Status}))
	})
	if err != nil {
		return apiv1.Allocation{}, err
	}
	if done != nil {
		return *done, nil
	}
	return s.Get(ctx, actor, id)
}

func (s *Service) beginRelease(ctx context.Context, tx *store.Tx, rec store.AllocationRecord, now time.Time) error {
	if err := tx.SetAllocationStatus(ctx, rec.ID, AllocReleasing, "", now); err != nil {
		return err
	}
	for _, c := range rec.Claims {
		if c.SlotID == "" || c.Status == "released" {
			continue
		}
		// A slot already marked failed stays failed (it goes to cleanup with the rest); the
		// savepoint keeps the refused transition from aborting the transaction.
		if err := tx.Savepoint(ctx, func(sp *store.Tx) error {
			return sp.SetSlotStatus(ctx, c.SlotID, SlotReleasing, "", nil)
		}); err != nil {
			if !errors.Is(err, store.ErrInvalid) {
				return err
			}
		}
	}
	// claims keep holding their slots (releasing) until wipe proof arrives
	if err := tx.SetClaimsStatus(ctx, rec.ID, "releasing", now); err != nil {
		return err
	}
	return tx.QueueOutbox(ctx, "allocation.release_requested", rec.ID, rec.NodeID, map[string]any{"allocation_id": rec.ID})
}

// transition moves an allocation, its live claims and its slots together.
func (s *Service) transition(ctx context.Context, id, from, to, slotTo, reason string) error {
	now := s.cfg.Now()
	return s.st.InTx(ctx, func(tx *store.Tx) error {
		rec, err := tx.GetAllocationForUpdate(ctx, id, "")
		if err != nil {
			return err
		}
		if rec.Status == to {
			return nil // idempotent: a repeated result changes nothing
		}
		if rec.Status != from || !CanTransition(AllocationTransitions, from, to) {
			return &apiv1.Error{Code: apiv1.CodeConflict, Message: fmt.Sprintf("allocation %s is %s, not %s", id, rec.Status, from)}
		}
		claimTo := to
		if to == AllocFailed {
			claimTo = "failed"
		}
		var slots []string
		for _, c := range rec.Claims {
			if c.SlotID != "" && slotTo != "" && c.Status != "released" {
				slots = append(slots, c.SlotID)
			}
		}
		return tx.Transition(ctx, store.Transition{AllocationID: id, NodeID: rec.NodeID, To: to, Reason: reason, At: now,
			SlotIDs: slots, SlotTo: slotTo, ClaimTo: claimTo})
	})
}

// MarkProvisioning records that the host started provisioning.
// It is MarkProvisioningMany for one allocation: a conflict unless the allocation is (now)
// provisioning.
func (s *Service) MarkProvisioning(ctx context.Context, id string) error {
	st, err := s.MarkProvisioningMany(ctx, []string{id})
	if err != nil {
		return err
	}
	if st[id] != AllocProvisioning {
		return &apiv1.Error{Code: apiv1.CodeConflict, Message: fmt.Sprintf("allocation %s is %s, not %s", id, st[id], AllocRequested)}
	}
	return nil
}

// MarkProvisioningMany is MarkProvisioning for every allocation of a poll's batch in one
// transaction (one commit, not one per task: under a burst of creates the commits of a
// host's batch queued behind each other and delayed the first phase by hundreds of ms,
// as make bench measured it), in one round trip. It returns each allocation's status afterwards:
// "provisioning" (marked now, or already: a redelivery), "active", or the status that makes
// its task undeliverable (released, failed, ...).
func (s *Service) MarkProvisioningMany(ctx context.Context, ids []string) (map[string]string, error) {
	var out map[string]string
	err := s.st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		out, err = tx.MarkProvisioning(ctx, ids)
		return err
	})
	if err == nil {
		for _, id := range ids {
			if _, ok := out[id]; !ok {
				return nil, fmt.Errorf("allocation %s: %w", id, store.ErrNotFound)
			}
		}
	}
	return out, err
}

// MarkActive records a passed readiness gate; billing starts here.
func (s *Service) MarkActive(ctx context.Context, id string) error {
	return s.transition(ctx, id, AllocProvisioning, AllocActive, SlotActive, "")
}

// MarkFailed records a provisioning failure. Slots whose devices may have been touched go to
// failed (they need cleanup with a verified wipe before reuse); claims are closed.
func (s *Service) MarkFailed(ctx context.Context, id, reason string) error {
	return s.markFailed(ctx, id, reason, true)
}

// MarkPlanInvalid fails an allocation whose host refused the plan before touching anything
// (seed 004 plan_invalid: device gone, VF missing, disk mounted, lease held). No cleanup is
// queued: wiping a disk the host says is mounted or leased to another allocation could
// destroy data in use. The slots go to failed with the reason, blocked until an operator
// repairs them (gpuaasctl slots wipe NODE INDEX --apply: a verified wipe), and new requests are placed elsewhere.
func (s *Service) MarkPlanInvalid(ctx context.Context, id, reason string) error {
	return s.markFailed(ctx, id, reason, false)
}

func (s *Service) markFailed(ctx context.Context, id, reason string, mayHaveTouched bool) error {
	if reason == "" {
		return invalid("a failure needs a reason")
	}
	now := s.cfg.Now()
	return s.st.InTx(ctx, func(tx *store.Tx) error {
		rec, err := tx.GetAllocationForUpdate(ctx, id, "")
		if err != nil {
			return err
		}
		if rec.Status == AllocFailed {
			return nil
		}
		if !CanTransition(AllocationTransitions, rec.Status, AllocFailed) {
			return &apiv1.Error{Code: apiv1.CodeConflict, Message: fmt.Sprintf("allocation %s is %s and cannot fail", id, rec.Status)}
		}
		if err := tx.SetAllocationStatus(ctx, id, AllocFailed, reason, now); err != nil {
			return err
		}
		for _, c := range rec.Claims {
			if c.SlotID == "" || c.Status == "released" {
				continue
			}
			to := SlotFailed
			if rec.Status == AllocRequested {
				to = SlotAvailable // never provisioned: nothing touched
			} else if cur := c.Status; cur == "releasing" {
				to = SlotCleanupBlocked
			}
			if err := tx.SetSlotStatus(ctx, c.SlotID, to, reason, nil); err != nil {
				return err
			}
		}
		if err := tx.SetClaimsStatus(ctx, id, "failed", now); err != nil {
			return err
		}
		// touched: the host may have written the disks; the dispatcher starts a cleanup
		// (release with wipe) so the slots can return once proven clean.
		return tx.QueueOutbox(ctx, "allocation.failed", id, rec.NodeID, map[string]any{"allocation_id": id, "reason": reason,
			"touched": mayHaveTouched && rec.Status != AllocRequested})
	})
}

// WipeProof is the host's evidence that a slot's disk was erased and read back clean. A
// verified proof counts only signed: the dispatcher checks Signature over Document against
// the reporting node's enrolled certificate (SignerCert, serial SignerSerial) before it gets
// here, and the database refuses a verified proof row without them.
type WipeProof struct {
	Verified bool   `json:"verified"`
	Method   string `json:"method"`
	Evidence string `json:"evidence"`
	Error    string `json:"error,omitempty"`

	NodeID         string    `json:"node_id,omitempty"` // the reporting node
	TaskID         string    `json:"task_id,omitempty"`
	DeviceIdentity string    `json:"device_identity,omitempty"`
	FinishedAt     time.Time `json:"finished_at,omitzero"`
	Document       string    `json:"document,omitempty"`
	Signature      string    `json:"signature,omitempty"`
	SignerSerial   string    `json:"signer_serial,omitempty"`
	SignerCert     string    `json:"signer_cert,omitempty"`
}

// CompleteRelease finishes a release: each slot with verified wipe proof returns to
// available (through cleanup); a slot without it is cleanup_blocked, alone. The allocation
// is released and its claims closed either way: the tenant's lease has ended.
func (s *Service) CompleteRelease(ctx context.Context, id string, proofs map[string]WipeProof) error {
	now := s.cfg.Now()
	return s.st.InTx(ctx, func(tx *store.Tx) error {
		rec, err := tx.GetAllocationForUpdate(ctx, id, "")
		if err != nil {
			return err
		}
		if rec.Status == AllocReleased {
			return nil
		}
		if rec.Status != AllocReleasing {
			return &apiv1.Error{Code: apiv1.CodeConflict, Message: fmt.Sprintf("allocation %s is %s, not releasing", id, rec.Status)}
		}
		for _, c := range rec.Claims {
			if c.SlotID == "" || c.Status == "released" {
				continue
			}
			if err := applyWipeProof(ctx, tx, c.SlotID, id, proofs, now, "wipe not verified"); err != nil {
				return err
			}
		}
		if err := tx.SetClaimsStatus(ctx, id, "released", now); err != nil {
			return err
		}
		if err := tx.SetAllocationStatus(ctx, id, AllocReleased, "", now); err != nil {
			return err
		}
		return tx.QueueOutbox(ctx, "allocation.released", id, rec.NodeID, map[string]any{"allocation_id": id})
	})
}

// CleanupFailed applies a cleanup's wipe proofs to a failed allocation's slots: a slot in
// failed (or cleanup_blocked) state with verified proof returns to available through
// cleanup; without proof it stays cleanup_blocked. The allocation stays failed.
func (s *Service) CleanupFailed(ctx context.Context, id string, proofs map[string]WipeProof) error {
	now := s.cfg.Now()
	return s.st.InTx(ctx, func(tx *store.Tx) error {
		rec, err := tx.GetAllocationForUpdate(ctx, id, "")
		if err != nil {
			return err
		}
		if rec.Status != AllocFailed {
			return &apiv1.Error{Code: apiv1.CodeConflict, Message: fmt.Sprintf("allocation %s is %s, not failed", id, rec.Status)}
		}
		for _, c := range rec.Claims {
			if c.SlotID == "" || c.Status == "released" {
				continue
			}
			status, err := tx.SlotStatus(ctx, c.SlotID)
			if err != nil {
				return err
			}
			if status != SlotFailed && status != SlotCleanupBlocked {
				continue // already cleaned, or never touched
			}
			if err := applyWipeProof(ctx, tx, c.SlotID, id, proofs, now, "cleanup after failure: wipe not verified"); err != nil {
				return err
			}
		}
		return nil
	})
}

// applyWipeProof moves a slot through cleanup: to available with verified, signed proof
// (recorded in slot_wipe_proofs, which clears the database's wipe gate, and summarised in
// health_metadata.last_wipe), else to cleanup_blocked alone.
func applyWipeProof(ctx context.Context, tx *store.Tx, slotID, allocID string, proofs map[string]WipeProof, now time.Time, blocked string) error {
	p, ok := proofs[slotID]
	if ok && p.Verified && (p.Signature == "" || p.SignerSerial == "") {
		p.Verified, p.Error = false, "wipe proof is not signed by the node's key"
	}
	verified := ok && p.Verified
	wipe := map[string]any{"last_wipe": map[string]any{"verified": verified, "method": p.Method,
		"evidence": p.Evidence, "error": p.Error, "at": now.UTC().Format(time.RFC3339), "allocation_id": allocID}}
	if err := tx.SetSlotStatus(ctx, slotID, SlotCleanup, "", wipe); err != nil {
		return err
	}
	if !ok {
		p.Error = "the host sent no wipe proof for this slot"
	}
	if err := recordProof(ctx, tx, slotID, allocID, p); err != nil {
		return err
	}
	if verified {
		if err := tx.SetSlotStatus(ctx, slotID, SlotAvailable, "", nil); err != nil {
			return err
		}
		return holdForValidation(ctx, tx, slotID)
	}
	if p.Error != "" {
		blocked += ": " + p.Error
	}
	return tx.SetSlotStatus(ctx, slotID, SlotCleanupBlocked, blocked, nil)
}

// recordProof appends a proof to slot_wipe_proofs (a verified one clears the slot's wipe gate).
func recordProof(ctx context.Context, tx *store.Tx, slotID, allocID string, p WipeProof) error {
	_, err := tx.RecordWipeProof(ctx, store.WipeProofRecord{SlotID: slotID, NodeID: p.NodeID, AllocationID: allocID, TaskID: p.TaskID,
		Verified: p.Verified, Method: p.Method, DeviceIdentity: p.DeviceIdentity, FinishedAt: p.FinishedAt, Document: p.Document,
		Signature: p.Signature, SignerSerial: p.SignerSerial, SignerCert: p.SignerCert, Error: p.Error})
	return err
}

// RepairSlot applies a standalone wipe's proof to a slot left cleanup_blocked or failed (no
// live claim): with verified proof it returns to available through cleanup, else it stays
// (or becomes) cleanup_blocked. This is the operator's repair path. A disabled slot that
// needs a wipe (it was disabled while blocked) only has the proof recorded: it stays
// disabled until the operator enables it, which the database then allows.
func (s *Service) RepairSlot(ctx context.Context, slotID string, proof WipeProof) error {
	now := s.cfg.Now()
	return s.st.InTx(ctx, func(tx *store.Tx) error {
		status, err := tx.SlotStatus(ctx, slotID)
		if err != nil {
			return err
		}
		if status == SlotDisabled {
			need, err := tx.SlotNeedsWipe(ctx, slotID)
			if err != nil {
				return err
			}
			if need {
				if proof.Verified && (proof.Signature == "" || proof.SignerSerial == "") {
					proof.Verified, proof.Error = false, "wipe proof is not signed by the node's key"
				}
				return recordProof(ctx, tx, slotID, "", proof)
			}
		}
		if status != SlotCleanupBlocked && status != SlotFailed {
			return &apiv1.Error{Code: apiv1.CodeConflict, Message: fmt.Sprintf("slot %s is %s; only cleanup_blocked or failed slots (or disabled ones that need a wipe) are repaired by a wipe", slotID, status)}
		}
		return applyWipeProof(ctx, tx, slotID, "", map[string]WipeProof{slotID: proof}, now, "repair wipe not verified")
	})
}
