package alloc

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuaas/gpuaas/internal/store"
)

// MaxPlacements bounds how many nodes one allocation may be tried on after hosts refuse
// their plans (plan_invalid).
const MaxPlacements = 3

// ErrNoReplacement says Replace found nothing to do: the allocation is no longer the
// provisioning placement on that node, or no other node can take it (Reason says why).
type ErrNoReplacement struct {
	Reason string
	Stale  bool // the allocation is no longer provisioning on that node: ignore the refusal
}

func (e *ErrNoReplacement) Error() string { return e.Reason }

// Replace answers a host's plan_invalid (seed 004: the node no longer matches the plan) for
// the allocation's current placement on nodeID: the refused slots go to failed with the
// host's reason (blocked until an operator repairs them; never wiped automatically), the old
// claims are released, and placement runs again excluding every node already tried. On
// success the allocation is back to requested on the new node with a new provision event.
// It returns *ErrNoReplacement, and changes nothing, when the allocation moved on already
// (a stale or duplicate result) or no other node fits; the caller then fails it.
func (s *Service) Replace(ctx context.Context, id, nodeID, reason string) (newNode string, err error) {
	now := s.cfg.Now()
	err = s.st.InTx(ctx, func(tx *store.Tx) error {
		rec, err := tx.GetAllocationForUpdate(ctx, id, "")
		if err != nil {
			return err
		}
		if rec.Status != AllocProvisioning || rec.CapacityShape != "gpu_slice" || rec.NodeID != nodeID {
			return &ErrNoReplacement{Stale: true, Reason: fmt.Sprintf("allocation is %s on node %s; the refusal from node %s is stale", rec.Status, rec.NodeID, nodeID)}
		}
		tried := map[string]bool{}
		for _, c := range rec.Claims {
			if c.NodeID != "" {
				tried[c.NodeID] = true
			}
		}
		if len(tried) >= MaxPlacements {
			return &ErrNoReplacement{Reason: fmt.Sprintf("sku_unavailable: %d nodes refused the plan", len(tried))}
		}
		if rec.ReservationID != "" {
			// A reservation's slots are all on one host, the one that refused: placed on the
			// fleet instead, the allocation would hold GPUs its quota counts as the reservation's.
			return &ErrNoReplacement{Reason: "sku_unavailable: the allocation is inside a capacity reservation, whose slots are all on the host that refused the plan"}
		}
		for _, c := range rec.Claims {
			if c.SlotID == "" || c.Status == "released" || c.Status == "failed" {
				continue
			}
			if err := tx.SetSlotStatus(ctx, c.SlotID, SlotFailed, reason, nil); err != nil {
				return err
			}
		}
		if err := tx.SetClaimsStatus(ctx, id, "released", now); err != nil {
			return err
		}
		r, err := s.resolveRequest(ctx, tx, Actor{Role: "tenant", TenantID: rec.TenantID}, rec.SKU, rec.GPUs, rec.Region)
		if err != nil {
			return &ErrNoReplacement{Reason: "sku_unavailable: " + err.Error()}
		}
		cands, err := tx.SliceCandidates(ctx, s.query(r))
		if err != nil {
			return err
		}
		kept := cands[:0]
		for _, c := range cands {
			if !tried[c.NodeID] {
				kept = append(kept, c)
			}
		}
		outcome, err := s.rank(ctx, tx, r, kept)
		if err != nil {
			return err
		}
		for i, ch := range outcome.Choices {
			if i >= s.cfg.MaxAttempts {
				break
			}
			var indexes []int
			err := tx.Savepoint(ctx, func(sp *store.Tx) error {
				claims, slotIDs, idx, err := lockChoice(ctx, sp, ch.NodeID, ch.SlotIDs, alternates(ch, kept), "")
				indexes = idx
				if err != nil {
					return err
				}
				return sp.Replace(ctx, id, ch.NodeID, usage(r, rec.Price, ch.NodeID, slotIDs), claims)
			})
			if errors.Is(err, errLostRace) || errors.Is(err, store.ErrConflict) {
				continue
			}
			if err != nil {
				return err
			}
			newNode = ch.NodeName
			return tx.Audit(ctx, store.AuditRecord{Actor: "gpuaas-controller", ActorRole: "system", Action: "allocation.replace",
				TargetKind: "allocation", TargetID: id, Details: map[string]any{"from_node": nodeID, "to_node": ch.NodeID,
					"slot_indexes": indexes, "reason": reason}})
		}
		return &ErrNoReplacement{Reason: fmt.Sprintf("sku_unavailable: no other node can take %d GPUs of %s", r.gpus, r.sku.SKU)}
	})
	return newNode, err
}
