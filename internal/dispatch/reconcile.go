package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// ReconcileTTL bounds a slice.reconcile task: a newer one supersedes it anyway.
const ReconcileTTL = 10 * time.Minute

// ReconcilePayload is what the controller believes runs on a node: its live slice
// allocations with the slots they were given.
func (d *Dispatcher) ReconcilePayload(ctx context.Context, nodeID string) (task.Reconcile, error) {
	p := task.Reconcile{Allocations: []task.ReconcileAllocation{}}
	err := d.st.InTx(ctx, func(tx *store.Tx) error {
		live, err := tx.LiveSliceAllocations(ctx, nodeID)
		if err != nil {
			return err
		}
		p.Allocations = p.Allocations[:0]
		for _, a := range live {
			snaps, err := tx.ClaimSnapshots(ctx, a.ID)
			if err != nil {
				return err
			}
			bundles, err := bundlesFromSnapshots(snaps)
			if err != nil {
				return err
			}
			p.Allocations = append(p.Allocations, task.ReconcileAllocation{AllocationID: a.ID, Status: a.Status, Bundles: bundles})
		}
		return nil
	})
	return p, err
}

// QueueReconcile queues slice.reconcile for a node and returns the task id.
func (d *Dispatcher) QueueReconcile(ctx context.Context, nodeID string, audit ...store.AuditRecord) (string, error) {
	p, err := d.ReconcilePayload(ctx, nodeID)
	if err != nil {
		return "", err
	}
	return d.QueueTask(ctx, nodeID, task.TypeReconcile, p, ReconcileTTL, audit...)
}

func (d *Dispatcher) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.ReconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		maxAge := d.cfg.ReconcileMaxAge
		if maxAge <= 0 {
			maxAge = 2 * time.Minute
		}
		nodes, err := d.st.ReachableNodes(ctx, d.now().Add(-maxAge))
		if err != nil {
			d.log.Warn("reconcile: list nodes", "err", err)
			continue
		}
		for _, n := range nodes {
			if _, err := d.QueueReconcile(ctx, n); err != nil && ctx.Err() == nil {
				d.log.Warn("reconcile: queue", "node", n, "err", err)
			}
		}
	}
}

// applyReconcile acts on a host's drift report. It blocks only what the evidence touches:
// an available slot leased on the host by no live allocation is disabled with the reason;
// drift of slots in use and orphan domains or reservations are audited and shown in the
// node's reconcile report (GET .../reconcile) for an operator to act on.
func (d *Dispatcher) applyReconcile(ctx context.Context, tr store.TaskRecord) error {
	var rep task.ReconcileReport
	if err := json.Unmarshal(tr.Output, &rep); err != nil {
		return fmt.Errorf("reconcile output: %w", err)
	}
	drifted := 0
	for _, s := range rep.Slots {
		if len(s.Drift) > 0 {
			drifted++
		}
	}
	if drifted == 0 && len(rep.OrphanDomains) == 0 && len(rep.OrphanLeases) == 0 && len(rep.OrphanReservations) == 0 {
		return nil
	}
	slots, err := d.st.ListSlots(ctx, tr.NodeID)
	if err != nil {
		return err
	}
	orphanLease := map[string]bool{}
	for _, id := range rep.OrphanLeases {
		orphanLease[id] = true
	}
	return d.st.InTx(ctx, func(tx *store.Tx) error {
		for _, sl := range slots {
			if !orphanLease[sl.ID] || sl.Status != "available" {
				continue
			}
			reason := "drift: the host holds a node-scheduler lease for this slot that no live allocation owns"
			if _, err := tx.SetSlotEnabled(ctx, tr.NodeID, sl.SlotIndex, false, reason); err != nil {
				return err
			}
			d.log.Warn("slot disabled by reconcile drift", "node", tr.NodeID, "slot", sl.SlotIndex)
			if err := tx.Audit(ctx, store.AuditRecord{Actor: "gpuaas-controller", ActorRole: "system", Action: "slot.drift",
				TargetKind: "slot", TargetID: sl.ID, Details: map[string]any{"node_id": tr.NodeID, "slot_index": sl.SlotIndex, "drift": []string{reason}, "task_id": tr.ID}}); err != nil {
				return err
			}
		}
		var lines []string
		for _, s := range rep.Slots {
			if len(s.Drift) > 0 {
				lines = append(lines, fmt.Sprintf("slot %d (%s): %s", s.SlotIndex, s.AllocationID, strings.Join(s.Drift, "; ")))
			}
		}
		return tx.Audit(ctx, store.AuditRecord{Actor: "gpuaas-controller", ActorRole: "system", Action: "node.drift",
			TargetKind: "node", TargetID: tr.NodeID, Details: map[string]any{"task_id": tr.ID, "slots": lines,
				"orphan_domains": rep.OrphanDomains, "orphan_leases": rep.OrphanLeases, "orphan_reservations": rep.OrphanReservations}})
	})
}
