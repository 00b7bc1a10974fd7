package store

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Constraint names of the health rules (migration 018), refused as conflicts.
const (
	QuarantineFence        = "slot_quarantine_fence"
	ClearNeedsValidation   = "slot_health_clear_needs_validation"
	healthGuard            = "slot_health_guard"
	healthEventsAppendOnly = "slot_health_append_only"
)

// HealthEventRecord is a health event to record: the slot (by id) or, with SlotID empty and
// action "drain", its node. The database applies it (migration 018): it moves the slot's
// health, names the live allocation, and drains the node past the threshold.
type HealthEventRecord struct {
	SlotID   string
	NodeID   string
	Source   string
	Signal   string
	Action   string // record, degrade, quarantine, clear, drain
	Reason   string
	Evidence any
	Actor    string
}

// RecordHealthEvent appends an event and returns it as applied (health before and after, the
// live allocation it was shown to).
func (t *Tx) RecordHealthEvent(ctx context.Context, ev HealthEventRecord) (apiv1.HealthEvent, error) {
	ev.Reason = truncate(ev.Reason, 500)
	evidence, err := json.Marshal(ev.Evidence)
	if err != nil || ev.Evidence == nil {
		evidence = []byte("{}")
	}
	var id int64
	err = t.tx.QueryRow(ctx, `INSERT INTO slot_health_events (slot_id, node_id, source, signal, action, reason, evidence, actor)
		VALUES ($1::uuid, coalesce($2::uuid, (SELECT node_id FROM node_resource_slots WHERE id = $1::uuid)), $3, $4, $5, $6, $7, $8)
		RETURNING id`,
		nullIfEmpty(ev.SlotID), nullIfEmpty(ev.NodeID), ev.Source, ev.Signal, ev.Action, ev.Reason, evidence, ev.Actor).Scan(&id)
	if err != nil {
		return apiv1.HealthEvent{}, translate(err)
	}
	evs, err := healthEvents(ctx, t.tx, `e.id = $1`, id, 1, true)
	if err != nil || len(evs) == 0 {
		return apiv1.HealthEvent{}, err
	}
	return evs[0], nil
}

// SlotByDevice returns the id and index of the node's slot whose GPU or fabric VF is the PCI
// function addr (lower case, as sysfs writes it).
func (t *Tx) SlotByDevice(ctx context.Context, nodeID, addr string) (string, int, error) {
	var id string
	var idx int
	err := t.tx.QueryRow(ctx, `SELECT id::text, slot_index FROM node_resource_slots
		WHERE node_id = $1 AND (lower(pci_address) = $2 OR lower(capacity_metadata->>'fabric_vf_pci_address') = $2)
		ORDER BY status = 'disabled', slot_index LIMIT 1`, nodeID, addr).Scan(&id, &idx)
	return id, idx, translate(err)
}

// SlotID returns the id of a node's slot by index.
func (t *Tx) SlotID(ctx context.Context, nodeID string, index int) (string, error) {
	var id string
	err := t.tx.QueryRow(ctx, `SELECT id::text FROM node_resource_slots WHERE node_id = $1 AND slot_index = $2`, nodeID, index).Scan(&id)
	return id, translate(err)
}

// ValidationRecord is one validation run to append (a failed one quarantines the slot).
type ValidationRecord struct {
	SlotID       string
	NodeID       string
	AllocationID string
	TaskID       string
	Level        string
	Passed       bool
	Simulated    bool
	Checks       []apiv1.ValidationCheck
	Summary      string
}

// RecordValidation appends a validation run.
func (t *Tx) RecordValidation(ctx context.Context, v ValidationRecord) (int64, error) {
	if v.Checks == nil {
		v.Checks = []apiv1.ValidationCheck{}
	}
	checks, err := json.Marshal(v.Checks)
	if err != nil {
		return 0, err
	}
	var id int64
	err = t.tx.QueryRow(ctx, `INSERT INTO slot_validations (slot_id, node_id, allocation_id, task_id, level, passed, simulated, checks, summary)
		VALUES ($1, $2, $3::uuid, $4::uuid, $5, $6, $7, $8, $9) RETURNING id`,
		v.SlotID, v.NodeID, nullIfEmpty(v.AllocationID), nullIfEmpty(v.TaskID), v.Level, v.Passed, v.Simulated, checks,
		truncate(v.Summary, 500)).Scan(&id)
	return id, translate(err)
}

// SlotHealth is a slot's health with its newest events and validations (at most limit each).
func (s *Store) SlotHealth(ctx context.Context, nodeID string, index, limit int) (apiv1.SlotHealth, error) {
	var out apiv1.SlotHealth
	var slotID string
	err := s.pool.QueryRow(ctx, `SELECT s.id::text, n.name, s.slot_index, s.health, s.health_reason, s.health_since
		FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id WHERE s.node_id = $1 AND s.slot_index = $2`,
		nodeID, index).Scan(&slotID, &out.NodeName, &out.SlotIndex, &out.Health, &out.HealthReason, &out.HealthSince)
	if err != nil {
		return out, translate(err)
	}
	if out.Events, err = healthEvents(ctx, s.pool, `e.slot_id = $1`, slotID, limit, true); err != nil {
		return out, err
	}
	out.Validations, err = s.validations(ctx, slotID, limit)
	return out, err
}

// AllocationHealthEvents are the events recorded while the allocation held the slots, oldest
// first, in the tenant's view (no node, evidence or actor).
func (s *Store) AllocationHealthEvents(ctx context.Context, allocationID string) ([]apiv1.HealthEvent, error) {
	if !IsUUID(allocationID) {
		return nil, nil
	}
	// The wait for a validation after the wipe is the platform's, not the tenant's.
	evs, err := healthEvents(ctx, s.pool, `e.allocation_id = $1 AND e.signal <> 'validation:pending'`, allocationID, 256, false)
	for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
		evs[i], evs[j] = evs[j], evs[i]
	}
	return evs, err
}

// healthEvents reads events, newest first; admin adds the node, evidence and actor.
func healthEvents(ctx context.Context, q querier, where string, arg any, limit int, admin bool) ([]apiv1.HealthEvent, error) {
	return queryAll(ctx, q, func(r pgx.Row, e *apiv1.HealthEvent) error {
		var node, actor string
		var evidence []byte
		if err := r.Scan(&e.ID, &e.At, &node, &e.SlotIndex, &e.AllocationID, &e.Source, &e.Signal, &e.Action,
			&e.HealthBefore, &e.HealthAfter, &e.Reason, &evidence, &actor); err != nil {
			return err
		}
		if admin {
			e.NodeName, e.Evidence, e.Actor = node, evidence, actor
			return nil
		}
		// An operator's and a validation's reasons are written for operators and may name
		// hosts and devices: the tenant reads what happened, not why in their words.
		switch e.Source {
		case "operator":
			e.Reason = "an operator changed the slot's health to " + e.HealthAfter
		case "validation":
			e.Reason = "a validation of the slot failed"
		}
		return nil
	}, `SELECT e.id, e.at, n.name, s.slot_index, coalesce(e.allocation_id::text, ''), e.source, e.signal, e.action,
			e.health_before, e.health_after, e.reason, e.evidence, e.actor
		FROM slot_health_events e JOIN nodes n ON n.id = e.node_id LEFT JOIN node_resource_slots s ON s.id = e.slot_id
		WHERE `+where+` ORDER BY e.id DESC LIMIT $2`, arg, limit)
}

func (s *Store) validations(ctx context.Context, slotID string, limit int) ([]apiv1.SlotValidation, error) {
	return queryAll(ctx, s.pool, func(r pgx.Row, v *apiv1.SlotValidation) error {
		var checks []byte
		if err := r.Scan(&v.ID, &v.AllocationID, &v.TaskID, &v.Level, &v.Passed, &v.Simulated, &checks, &v.Summary, &v.RecordedAt); err != nil {
			return err
		}
		return json.Unmarshal(checks, &v.Checks)
	}, `SELECT id, coalesce(allocation_id::text, ''), coalesce(task_id::text, ''), level, passed, simulated, checks, summary, recorded_at
		FROM slot_validations WHERE slot_id = $1 ORDER BY id DESC LIMIT $2`, slotID, limit)
}

// FleetHealth summarises every node's slot health, worst first: most quarantined slots, then
// most degraded, drained nodes before the others, then by name.
func (s *Store) FleetHealth(ctx context.Context) ([]apiv1.NodeHealth, error) {
	return queryAll(ctx, s.pool, func(r pgx.Row, h *apiv1.NodeHealth) error {
		return r.Scan(&h.Node, &h.Status, &h.Draining, &h.DrainReason, &h.Slots, &h.Healthy, &h.Degraded, &h.Quarantined,
			&h.LastEventAt, &h.LastEvent)
	}, `SELECT n.name, n.status, n.draining, n.drain_reason,
			count(s.id)::int, (count(s.id) FILTER (WHERE s.health = 'healthy'))::int,
			(count(s.id) FILTER (WHERE s.health = 'degraded'))::int, (count(s.id) FILTER (WHERE s.health = 'quarantined'))::int,
			le.at, coalesce(le.reason, '')
		FROM nodes n LEFT JOIN node_resource_slots s ON s.node_id = n.id AND s.status <> 'disabled'
		LEFT JOIN LATERAL (SELECT e.at, e.reason FROM slot_health_events e WHERE e.node_id = n.id ORDER BY e.id DESC LIMIT 1) le ON true
		WHERE n.status <> 'retired'
		GROUP BY n.id, le.at, le.reason
		ORDER BY 8 DESC, 7 DESC, n.draining DESC, n.name`)
}

// QuarantinedSlots counts quarantined slots by node and slice SKU (the gpuaas_slots_quarantined gauge).
func (s *Store) QuarantinedSlots(ctx context.Context) (map[[2]string]int, error) {
	type row struct {
		node, sku string
		n         int
	}
	rows, err := queryAll(ctx, s.pool, func(r pgx.Row, x *row) error { return r.Scan(&x.node, &x.sku, &x.n) },
		`SELECT n.name, coalesce(nullif(s.capacity_metadata->>'sku', ''), n.slice_sku, ''), count(*)::int
		FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
		WHERE s.health = 'quarantined' GROUP BY 1, 2`)
	out := map[[2]string]int{}
	for _, x := range rows {
		out[[2]string{x.node, x.sku}] = x.n
	}
	return out, err
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// QuarantineSignal returns the signal of the event that put a quarantined slot in quarantine
// ("" when the slot is not quarantined).
func (t *Tx) QuarantineSignal(ctx context.Context, slotID string) (string, error) {
	var sig string
	err := t.tx.QueryRow(ctx, `SELECT CASE WHEN health = 'quarantined' THEN health_signal ELSE '' END
		FROM node_resource_slots WHERE id = $1`, slotID).Scan(&sig)
	return sig, translate(err)
}

// SlotValidationPolicy is the validation policy of the SKU a slot sells (its own SKU, else its
// node's slice SKU): none, quick or burn-in.
func (t *Tx) SlotValidationPolicy(ctx context.Context, slotID string) (string, error) {
	var p string
	err := t.tx.QueryRow(ctx, `SELECT coalesce(k.validation_policy, 'none')
		FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
		LEFT JOIN sku_catalog k ON k.sku = coalesce(nullif(s.capacity_metadata->>'sku', ''), n.slice_sku)
		WHERE s.id = $1`, slotID).Scan(&p)
	return p, translate(err)
}

// PendingValidations are the slots of a node quarantined only while they wait for their
// SKU's validation, with what the host needs to validate them.
func (s *Store) PendingValidations(ctx context.Context, nodeID string) ([]apiv1.Slot, error) {
	return queryAll(ctx, s.pool, scanSlot, `SELECT `+slotColumns+` FROM node_resource_slots s
		WHERE s.node_id = $1 AND s.health = 'quarantined' AND s.health_signal = 'validation:pending'
		ORDER BY s.slot_index`, nodeID)
}

// SlotsWithLiveTask are the slots of a node with a queued or leased task of type typ (by the
// payload's slot_id).
func (s *Store) SlotsWithLiveTask(ctx context.Context, nodeID, typ string) (map[string]bool, error) {
	ids, err := queryAll(ctx, s.pool, func(r pgx.Row, id *string) error { return r.Scan(id) },
		`SELECT payload->>'slot_id' FROM node_tasks WHERE node_id = $1 AND type = $2 AND status IN ('queued', 'leased')
		   AND payload ? 'slot_id'`, nodeID, typ)
	out := map[string]bool{}
	for _, id := range ids {
		out[id] = true
	}
	return out, err
}

// SlotOfAllocationGPU is the slot an allocation's GPU number idx is, on the given node: its
// live slot claims there, by slot index (the order the allocation's slots are listed in).
func (t *Tx) SlotOfAllocationGPU(ctx context.Context, nodeID, allocationID string, idx int) (string, error) {
	if !IsUUID(allocationID) || idx < 0 {
		return "", ErrNotFound
	}
	var id string
	err := t.tx.QueryRow(ctx, `SELECT s.id::text FROM allocation_resource_claims c JOIN node_resource_slots s ON s.id = c.slot_id
		WHERE c.allocation_id = $1 AND c.node_id = $2 AND c.claim_kind = 'slot' AND c.status IN `+liveClaim+`
		ORDER BY s.slot_index OFFSET $3 LIMIT 1`, allocationID, nodeID, idx).Scan(&id)
	return id, translate(err)
}

// SlotByDisk is the node's slot whose nvme_device is one of names (by-id paths of one
// namespace); a slot naming a partition of it counts, as the identity check reads it.
func (t *Tx) SlotByDisk(ctx context.Context, nodeID string, names []string) (string, error) {
	var id string
	err := t.tx.QueryRow(ctx, `SELECT id::text FROM node_resource_slots
		WHERE node_id = $1 AND nvme_device <> '' AND regexp_replace(nvme_device, '-part[0-9]+$', '') = ANY ($2::text[])
		ORDER BY status = 'disabled', slot_index LIMIT 1`, nodeID, names).Scan(&id)
	return id, translate(err)
}
