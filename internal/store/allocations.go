package store

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// AllocationRecord is an allocation with the raw snapshots the service turns into API form.
type AllocationRecord struct {
	apiv1.Allocation
	PriceSnapshot   json.RawMessage
	ResolvedProfile json.RawMessage
	ImageSnapshot   json.RawMessage
	UsageSnapshot   json.RawMessage
	RequestHash     string
}

// allocColumns reads an allocation from allocFrom. Its snapshots come from its terms and
// snapshot row (migration 035), or from its own columns when it has none (written before); the
// usage snapshot from its own column once a re-placement wrote one there.
const allocColumns = `a.id::text, a.tenant_id::text, a.sku, a.capacity_shape, a.gpus_total, a.region, a.status,
	a.placement_status, a.node_id::text, n.name, a.profile_name, ` + allocSnapshotColumns + `,
	a.failure_reason, a.request_hash, a.created_at,
	a.active_at, a.releasing_at, a.released_at, n.simulated, coalesce(a.reservation_id::text, '')`

// allocSnapshotColumns are the resolved profile, image, price and usage snapshots and the SSH
// keys of allocation a with its snapshot row x and terms t (see allocFrom).
const allocSnapshotColumns = `coalesce(t.resolved_profile, a.resolved_profile), coalesce(t.image_snapshot, a.image_snapshot),
	coalesce(t.price_snapshot, a.price_snapshot),
	CASE WHEN a.usage_snapshot <> '{}' OR x.allocation_id IS NULL THEN a.usage_snapshot ELSE x.usage_snapshot END,
	coalesce(x.ssh_public_keys, a.ssh_public_keys)`

// allocSnapshotsJoin joins allocation a's snapshot row x and its terms t (none for an
// allocation written before migration 035).
const allocSnapshotsJoin = `LEFT JOIN allocation_snapshots x ON x.allocation_id = a.id LEFT JOIN allocation_terms t ON t.id = x.terms_id`

// allocFrom is the allocation a, its node n, its snapshot row x and its terms t.
const allocFrom = `allocations a JOIN nodes n ON n.id = a.node_id ` + allocSnapshotsJoin

func scanAlloc(row pgx.Row, a *AllocationRecord) error {
	var profileName string
	err := row.Scan(&a.ID, &a.TenantID, &a.SKU, &a.CapacityShape, &a.GPUs, &a.Region, &a.Status, &a.PlacementStatus,
		&a.NodeID, &a.NodeName, &profileName, rawJSON(&a.ResolvedProfile), rawJSON(&a.ImageSnapshot), rawJSON(&a.PriceSnapshot),
		rawJSON(&a.UsageSnapshot), &a.SSHPublicKeys, &a.FailureReason, &a.RequestHash, &a.CreatedAt, &a.ActiveAt,
		&a.ReleasingAt, &a.ReleasedAt, &a.Simulated, &a.ReservationID)
	a.Profile.Name = profileName
	return err
}

// GetAllocation loads an allocation and its claims. tenantID != "" restricts to that tenant
// (a tenant asking for another tenant's allocation gets ErrNotFound, not a hint it exists).
func (s *Store) GetAllocation(ctx context.Context, id, tenantID string) (AllocationRecord, error) {
	return getAllocation(ctx, s.pool, id, tenantID, false)
}

// GetAllocationForUpdate loads and row-locks an allocation inside a transaction.
func (t *Tx) GetAllocationForUpdate(ctx context.Context, id, tenantID string) (AllocationRecord, error) {
	return getAllocation(ctx, t.tx, id, tenantID, true)
}

// GetAllocation inside a transaction.
func (t *Tx) GetAllocation(ctx context.Context, id, tenantID string) (AllocationRecord, error) {
	return getAllocation(ctx, t.tx, id, tenantID, false)
}

// GetAllocationWithTasks reads an allocation, its claims and its host tasks (newest first)
// in one round trip.
func (s *Store) GetAllocationWithTasks(ctx context.Context, id, tenantID string) (AllocationRecord, []TaskRecord, error) {
	var tasks []TaskRecord
	rec, err := getAllocationBatch(ctx, s.pool, id, tenantID, false, func(b *pgx.Batch) {
		b.Queue(allocTasksSQL, uuidArg(id))
	}, func(br pgx.BatchResults) (err error) {
		tasks, err = readTasks(br)
		return err
	})
	return rec, tasks, err
}

// allocTasksSQL reads an allocation's host tasks, newest first ($1: the allocation id), as
// the allocation's view shows them: not their payloads (a provisioning plan is 2 KiB of JSON,
// stored compressed) or outputs, which only hosts and the dispatcher read.
var allocTasksSQL = `SELECT ` + allocTaskColumns + `
	FROM node_tasks WHERE allocation_id = $1::uuid ORDER BY created_at DESC LIMIT ` + strconv.Itoa(allocTasksShown)

// allocTasksShown is how many of an allocation's tasks its view shows (the newest).
const allocTasksShown = 200

// allocTaskColumns are the fields of a node_tasks row readTasks reads.
const allocTaskColumns = `id::text, type, status, attempt, phases, error, created_at, schema_version`

// readTasks reads the result of allocTasksSQL queued in a batch: the tasks' ids, types,
// states, attempts, phases, errors and creation times.
func readTasks(br pgx.BatchResults) ([]TaskRecord, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	var tasks []TaskRecord
	for rows.Next() {
		var tr TaskRecord
		var phases []byte
		if err := rows.Scan(&tr.ID, &tr.Type, &tr.Status, &tr.Attempt, &phases, &tr.Error, &tr.CreatedAt, &tr.SchemaVersion); err != nil {
			return nil, translate(err)
		}
		if tr.Phases, err = decodePhases(tr.ID, phases); err != nil {
			return nil, err
		}
		tasks = append(tasks, tr)
	}
	return tasks, translate(rows.Err())
}

func getAllocation(ctx context.Context, q querier, id, tenantID string, lock bool) (AllocationRecord, error) {
	return getAllocationBatch(ctx, q, id, tenantID, lock, nil, nil)
}

// getAllocationBatch reads an allocation and its claims in one round trip; more, when set,
// queues further statements whose results readMore reads.
func getAllocationBatch(ctx context.Context, q querier, id, tenantID string, lock bool, more func(*pgx.Batch), readMore func(pgx.BatchResults) error) (AllocationRecord, error) {
	sql := allocByIDSQL + ` AND ($2::uuid IS NULL OR a.tenant_id = $2::uuid)`
	if lock {
		sql += ` FOR UPDATE OF a`
	}
	// One round trip: the claims query rides along (it reads nothing the tenant check hides:
	// its rows are returned only when the allocation row was found).
	b := &pgx.Batch{}
	b.Queue(sql, uuidArg(id), optUUID(tenantID))
	b.Queue(claimsSQL, uuidArg(id))
	if more != nil {
		more(b)
	}
	br := q.SendBatch(ctx, b)
	defer br.Close()
	a, err := readAllocation(br)
	if err != nil || readMore == nil {
		return a, err
	}
	return a, readMore(br)
}

// allocByIDSQL reads one allocation ($1) with its node name.
const allocByIDSQL = `SELECT ` + allocColumns + ` FROM ` + allocFrom + ` WHERE a.id = $1::uuid`

// insertedAllocColumns are allocColumns as allocationInsertSQL returns them (RETURNING: the row
// as written, its node's name and simulated flag looked up by primary key). The snapshots are
// the statement's own parameters ($8, $10-$13), cast as their columns are: once they live in
// the allocation's snapshot row (migration 035) the allocation's columns keep their defaults.
const insertedAllocColumns = `id::text, tenant_id::text, sku, capacity_shape, gpus_total, region, status,
	placement_status, node_id::text, (SELECT n.name FROM nodes n WHERE n.id = allocations.node_id), profile_name,
	$8::jsonb, $10::jsonb, $11::jsonb, $12::jsonb, $13::text[], failure_reason, request_hash,
	created_at, active_at, releasing_at, released_at, (SELECT n.simulated FROM nodes n WHERE n.id = allocations.node_id),
	coalesce(reservation_id::text, '')`

// readAllocation reads the results of an allocation query and claimsSQL queued in a batch.
func readAllocation(br pgx.BatchResults) (AllocationRecord, error) {
	var a AllocationRecord
	if err := scanAlloc(br.QueryRow(), &a); err != nil {
		return a, translate(err)
	}
	rows, err := br.Query()
	if err != nil {
		return a, translate(err)
	}
	a.Claims, err = scanClaims(rows)
	return a, err
}

// claimsSQL reads an allocation's claims with their device snapshot's fields taken out by the
// database (jsonb field access): decoding each snapshot's text in Go was 8% of the
// controller's CPU in a 16-client create+release profile.
const claimsSQL = `SELECT ` + claimColumns + `
	FROM ` + claimsFrom + ` WHERE c.allocation_id = $1::uuid
	ORDER BY (` + claimSnapshot + `->>'slot_index')::int NULLS FIRST, c.id`

// claimsFrom is the claims (c) with the device snapshots their slot claims refer to (d): a
// slot claim records its devices as a reference to its slot's snapshot at the time
// (migration 034); claims made before keep their own copy in resource_snapshot.
const claimsFrom = `allocation_resource_claims c LEFT JOIN slot_device_snapshots d ON d.id = c.device_snapshot_id`

// claimSnapshot is a claim's device snapshot, in a query over claimsFrom.
const claimSnapshot = `coalesce(d.snapshot, c.resource_snapshot)`

// claimColumns are the claim fields scanClaims reads, from claimsFrom.
const claimColumns = `c.id::text, c.claim_kind, c.status, c.node_id::text, coalesce(c.slot_id::text, ''),
		(` + claimSnapshot + `->>'slot_index')::int, (` + claimSnapshot + `->>'numa_node')::int,
		coalesce(` + claimSnapshot + `->>'pci_address', ''), coalesce(` + claimSnapshot + `->>'nvme_device', ''),
		coalesce(` + claimSnapshot + `->>'fabric_vf_pci_address', ''), coalesce(` + claimSnapshot + `->>'mac_address', ''),
		coalesce(` + claimSnapshot + `->>'private_ip', ''), c.created_at`

func scanClaims(rows pgx.Rows) ([]apiv1.Claim, error) {
	defer rows.Close()
	var out []apiv1.Claim
	for rows.Next() {
		var c apiv1.Claim
		if err := rows.Scan(claimDest(&c)...); err != nil {
			return nil, translate(err)
		}
		out = append(out, c)
	}
	return out, translate(rows.Err())
}

// claimDest is where a row of claimColumns scans to.
func claimDest(c *apiv1.Claim) []any {
	return []any{&c.ID, &c.Kind, &c.Status, &c.NodeID, &c.SlotID, &c.SlotIndex, &c.NUMANode,
		&c.PCIAddress, &c.NVMeDevice, &c.FabricVF, &c.MACAddress, &c.PrivateIP, &c.CreatedAt}
}

// AllocationFilter narrows ListAllocations.
type AllocationFilter struct {
	TenantID string // "" = all tenants (admin)
	Status   string
	Limit    int
}

// ListAllocations returns newest first, each with its claims (two queries in one round trip:
// the claims of the listed allocations ride along in the batch).
func (s *Store) ListAllocations(ctx context.Context, f AllocationFilter) ([]AllocationRecord, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 500
	}
	const listed = `SELECT a.id FROM allocations a
		WHERE ($1::uuid IS NULL OR a.tenant_id = $1::uuid) AND ($2 = '' OR a.status = $2)
		ORDER BY a.created_at DESC, a.id LIMIT $3`
	b := &pgx.Batch{}
	b.Queue(`SELECT `+allocColumns+` FROM `+allocFrom+`
		WHERE a.id IN (`+listed+`) ORDER BY a.created_at DESC, a.id`, optUUID(f.TenantID), f.Status, f.Limit)
	b.Queue(`SELECT c.allocation_id::text, `+claimColumns+` FROM `+claimsFrom+`
		WHERE c.allocation_id IN (`+listed+`)
		ORDER BY c.allocation_id, (`+claimSnapshot+`->>'slot_index')::int NULLS FIRST, c.id`, optUUID(f.TenantID), f.Status, f.Limit)
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return nil, translate(err)
	}
	var out []AllocationRecord
	byID := map[string]int{}
	for rows.Next() {
		var a AllocationRecord
		if err := scanAlloc(rows, &a); err != nil {
			rows.Close()
			return nil, translate(err)
		}
		byID[a.ID] = len(out)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, translate(err)
	}
	rows, err = br.Query()
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var c apiv1.Claim
		if err := rows.Scan(append([]any{&id}, claimDest(&c)...)...); err != nil {
			return nil, translate(err)
		}
		if i, ok := byID[id]; ok {
			out[i].Claims = append(out[i].Claims, c)
		}
	}
	return out, translate(rows.Err())
}

const setAllocationStatusSQL = `UPDATE allocations SET status = $2::text,
		failure_reason = CASE WHEN $3::text <> '' THEN $3::text ELSE failure_reason END,
		active_at = CASE WHEN $2::text = 'active' THEN $4::timestamptz ELSE active_at END,
		releasing_at = CASE WHEN $2::text = 'releasing' AND releasing_at IS NULL THEN $4::timestamptz ELSE releasing_at END,
		released_at = CASE WHEN $2::text = 'released' THEN $4::timestamptz ELSE released_at END,
		placement_status = CASE WHEN $2::text = 'released' THEN 'released' ELSE placement_status END
	WHERE id = $1`

const setClaimsStatusSQL = `UPDATE allocation_resource_claims SET status = $2::text,
		released_at = CASE WHEN $2::text IN ('released', 'failed') THEN $3::timestamptz ELSE NULL END
	WHERE allocation_id = $1 AND status NOT IN ('released', 'failed')`

// SetAllocationStatus moves an allocation; the database trigger rejects invalid transitions.
func (t *Tx) SetAllocationStatus(ctx context.Context, id, status, failureReason string, at time.Time) error {
	_, err := t.tx.Exec(ctx, setAllocationStatusSQL, id, status, failureReason, at)
	return translate(err)
}

// Transition is an allocation's move with its claims and slots (see Tx.Transition).
type Transition struct {
	AllocationID, NodeID string
	To, Reason           string
	At                   time.Time
	SlotIDs              []string // moved to SlotTo (the trigger refuses invalid moves)
	SlotTo, ClaimTo      string
}

// Transition moves an allocation, its live claims and the given slots, and queues the
// allocation.<to> outbox event, in one round trip.
func (t *Tx) Transition(ctx context.Context, tr Transition) error {
	payload, err := json.Marshal(map[string]any{"allocation_id": tr.AllocationID, "reason": tr.Reason})
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(setAllocationStatusSQL, tr.AllocationID, tr.To, tr.Reason, tr.At)
	if len(tr.SlotIDs) > 0 && tr.SlotTo != "" {
		b.Queue(`UPDATE node_resource_slots SET status = $2, status_reason = $3 WHERE id = ANY($1::uuid[])`, uuidsArg(tr.SlotIDs), tr.SlotTo, tr.Reason)
	}
	b.Queue(setClaimsStatusSQL, tr.AllocationID, tr.ClaimTo, tr.At)
	b.Queue(`INSERT INTO outbox (topic, aggregate_id, node_id, payload) VALUES ($1, $2, $3, $4)`,
		"allocation."+tr.To, tr.AllocationID, nullIfEmpty(tr.NodeID), payload)
	return translate(t.tx.SendBatch(ctx, b).Close())
}

// MarkProvisioning moves every allocation of ids that is still requested to provisioning
// (their live claims and slots too, one allocation.provisioning outbox event each: what
// Transition does for one) in one round trip, and returns every allocation's status
// afterwards. The dispatcher calls it for a poll's whole batch of provisioning tasks.
func (t *Tx) MarkProvisioning(ctx context.Context, ids []string) (map[string]string, error) {
	b := &pgx.Batch{}
	b.Queue(`WITH moved AS (
			UPDATE allocations SET status = 'provisioning' WHERE id = ANY($1::uuid[]) AND status = 'requested'
			RETURNING id, node_id),
		claims AS (
			UPDATE allocation_resource_claims c SET status = 'provisioning', released_at = NULL FROM moved
			WHERE c.allocation_id = moved.id AND c.status NOT IN ('released', 'failed')
			RETURNING c.slot_id),
		slots AS ( -- data-modifying CTEs always run to completion, read or not
			UPDATE node_resource_slots s SET status = 'provisioning', status_reason = '' FROM claims
			WHERE s.id = claims.slot_id)
		INSERT INTO outbox (topic, aggregate_id, node_id, payload)
		SELECT 'allocation.provisioning', id, node_id, jsonb_build_object('allocation_id', id, 'reason', '') FROM moved`, uuidsArg(ids))
	b.Queue(`SELECT id::text, status FROM allocations WHERE id = ANY($1::uuid[])`, uuidsArg(ids))
	br := t.tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, translate(err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, translate(err)
	}
	out := make(map[string]string, len(ids))
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			rows.Close()
			return nil, translate(err)
		}
		out[id] = st
	}
	rows.Close()
	return out, translate(rows.Err())
}

// CancelRequested releases an allocation that never reached its host, in one round trip:
// requested -> released in one update (releasing_at = released_at), its slots back to available, its claims released, an
// allocation.released outbox event and the audit record. locked and tasks are the allocation
// and its tasks as LockForRelease read them (locked); it returns them as written, from what
// the updates return (the allocation's new state, the claims they released), without reading
// them again. It also commits the transaction in the same round trip: it must be the
// transaction's last statement (a statement after it fails).
func (t *Tx) CancelRequested(ctx context.Context, locked AllocationRecord, tasks []TaskRecord, slotIDs []string, at time.Time, audit AuditRecord) (AllocationRecord, []TaskRecord, error) {
	id := locked.ID
	payload, err := json.Marshal(map[string]any{"allocation_id": id, "cancelled_before_provisioning": true})
	if err != nil {
		return AllocationRecord{}, nil, err
	}
	b := &pgx.Batch{}
	// PostgreSQL re-plans the slot update on every call (its custom plan for a 4-element
	// array looks cheaper than the generic one, which is the same index scan): 0.1 ms a
	// release, more than this statement costs.
	b.Queue(`SET LOCAL plan_cache_mode = force_generic_plan`)
	if len(slotIDs) > 0 {
		b.Queue(`UPDATE node_resource_slots SET status = 'available', status_reason = '' WHERE id = ANY($1::uuid[])`, uuidsArg(slotIDs))
	}
	b.Queue(`UPDATE allocation_resource_claims SET status = 'released', released_at = $2
		WHERE allocation_id = $1 AND status NOT IN ('released', 'failed') RETURNING id::text, status`, id, at)
	b.Queue(`UPDATE allocations SET status = 'released', releasing_at = coalesce(releasing_at, $2), released_at = $2,
		placement_status = 'released' WHERE id = $1
		RETURNING status, placement_status, failure_reason, active_at, releasing_at, released_at`, id, at)
	// Informational: no host has anything to do, so the event is recorded already dispatched.
	b.Queue(`INSERT INTO outbox (topic, aggregate_id, node_id, payload, dispatched_at) VALUES ('allocation.released', $1, $2, $3, now())`,
		id, nullIfEmpty(locked.NodeID), payload)
	if err := queueAudit(b, audit); err != nil {
		return AllocationRecord{}, nil, err
	}
	queued := b.Len()
	committing := t.tx.queueCommit(b)
	br := t.tx.SendBatch(ctx, b)
	defer br.Close()
	read := 1
	if len(slotIDs) > 0 {
		read++
	}
	for range read {
		if _, err := br.Exec(); err != nil {
			return AllocationRecord{}, nil, translate(err)
		}
	}
	rec := locked
	rec.Claims = slices.Clone(locked.Claims)
	rows, err := br.Query()
	if err != nil {
		return AllocationRecord{}, nil, translate(err)
	}
	released := map[string]string{}
	for rows.Next() {
		var cid, st string
		if err := rows.Scan(&cid, &st); err != nil {
			rows.Close()
			return AllocationRecord{}, nil, translate(err)
		}
		released[cid] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return AllocationRecord{}, nil, translate(err)
	}
	for i, c := range rec.Claims {
		if st, ok := released[c.ID]; ok {
			rec.Claims[i].Status = st
		}
	}
	if err := br.QueryRow().Scan(&rec.Status, &rec.PlacementStatus, &rec.FailureReason, &rec.ActiveAt,
		&rec.ReleasingAt, &rec.ReleasedAt); err != nil {
		return AllocationRecord{}, nil, translate(err)
	}
	if err := t.endBatch(br, read+2, queued, committing); err != nil {
		return AllocationRecord{}, nil, err
	}
	return rec, tasks, nil
}

// SetClaimsStatus moves every non-final claim of an allocation.
func (t *Tx) SetClaimsStatus(ctx context.Context, allocID, status string, at time.Time) error {
	_, err := t.tx.Exec(ctx, setClaimsStatusSQL, allocID, status, at)
	return translate(err)
}

// SetSlotStatus moves one slot; the trigger rejects invalid transitions.
func (t *Tx) SetSlotStatus(ctx context.Context, slotID, status, reason string, health map[string]any) error {
	h := []byte("null")
	if health != nil {
		h, _ = json.Marshal(health)
	}
	_, err := t.tx.Exec(ctx, `UPDATE node_resource_slots SET status = $2, status_reason = $3,
			health_metadata = CASE WHEN $4::jsonb = 'null'::jsonb THEN health_metadata ELSE health_metadata || $4::jsonb END
		WHERE id = $1`, slotID, status, reason, h)
	return translate(err)
}

// QueueOutbox appends an outbox event.
func (t *Tx) QueueOutbox(ctx context.Context, topic, aggregateID, nodeID string, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	_, err = t.tx.Exec(ctx, `INSERT INTO outbox (topic, aggregate_id, node_id, payload) VALUES ($1, $2, $3, $4)`,
		topic, aggregateID, nullIfEmpty(nodeID), b)
	return translate(err)
}

// SlotStatus reads one slot's status (locking it for the transaction).
func (t *Tx) SlotStatus(ctx context.Context, slotID string) (string, error) {
	var st string
	err := t.tx.QueryRow(ctx, `SELECT status FROM node_resource_slots WHERE id = $1 FOR UPDATE`, slotID).Scan(&st)
	return st, translate(err)
}
