package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// ErrTokenSpent is a bootstrap token that was already used or has expired.
var ErrTokenSpent = errors.New("bootstrap token already used or expired")

// CreateBootstrapToken stores the hash of a one-time node enrollment token.
func (t *Tx) CreateBootstrapToken(ctx context.Context, nodeID, hash string, expiresAt time.Time) error {
	_, err := t.tx.Exec(ctx, `INSERT INTO node_bootstrap_tokens (node_id, token_hash, expires_at) VALUES ($1, $2, $3)`,
		nodeID, hash, expiresAt)
	return translate(err)
}

// ConsumeBootstrapToken marks a token used and returns its node. Unknown tokens are
// ErrNotFound; used or expired ones ErrTokenSpent.
func (t *Tx) ConsumeBootstrapToken(ctx context.Context, hash string, now time.Time) (string, error) {
	var id, nodeID string
	var expires time.Time
	var used *time.Time
	err := t.tx.QueryRow(ctx, `SELECT id::text, node_id::text, expires_at, used_at FROM node_bootstrap_tokens
		WHERE token_hash = $1 FOR UPDATE`, hash).Scan(&id, &nodeID, &expires, &used)
	if err != nil {
		return "", translate(err)
	}
	if used != nil || !now.Before(expires) {
		return "", ErrTokenSpent
	}
	_, err = t.tx.Exec(ctx, `UPDATE node_bootstrap_tokens SET used_at = $2 WHERE id = $1`, id, now)
	return nodeID, translate(err)
}

// RecordEnrollmentRuntime records, in the transaction that consumed the node's bootstrap
// token, whether its hostd runs the sim runtime. Only here may a node marked simulated be
// cleared (an admin issued the token to enroll it again); a heartbeat reporting sim marks it
// again (migration 016).
func (t *Tx) RecordEnrollmentRuntime(ctx context.Context, nodeID string, simulated bool) error {
	_, err := t.tx.Exec(ctx, `SELECT set_config('gpuaas.reenroll', $1, true)`, nodeID)
	if err != nil {
		return translate(err)
	}
	_, err = t.tx.Exec(ctx, `UPDATE nodes SET simulated = $2 WHERE id = $1 AND simulated IS DISTINCT FROM $2`, nodeID, simulated)
	return translate(err)
}

// RecordCredential remembers an issued node certificate.
func (t *Tx) RecordCredential(ctx context.Context, serial, nodeID string, notAfter time.Time) error {
	_, err := t.tx.Exec(ctx, `INSERT INTO node_credentials (serial, node_id, not_after) VALUES ($1, $2, $3)`, serial, nodeID, notAfter)
	return translate(err)
}

// CredentialNode returns the node of a valid (known, unrevoked, unexpired) certificate serial.
// A superseded certificate (renewed) carries its end in revoked_at and is valid until then.
func (s *Store) CredentialNode(ctx context.Context, serial string) (string, error) {
	var nodeID string
	err := s.pool.QueryRow(ctx, `SELECT node_id::text FROM node_credentials
		WHERE serial = $1 AND (revoked_at IS NULL OR revoked_at > now()) AND not_after > now()`, serial).Scan(&nodeID)
	return nodeID, translate(err)
}

// TaskRecord is a node_tasks row; it is the admin API's task type.
type TaskRecord = apiv1.Task

const taskColumns = `id::text, node_id::text, coalesce(allocation_id::text, ''), type, payload, status, attempt, max_attempts,
	not_after, lease_expires_at, output, phases, error, created_at, updated_at, completed_at, schema_version`

func scanTask(r pgx.Row, t *TaskRecord) error {
	var phases []byte
	if err := r.Scan(&t.ID, &t.NodeID, &t.AllocationID, &t.Type, rawJSON(&t.Payload), &t.Status, &t.Attempt, &t.MaxAttempts,
		&t.NotAfter, &t.LeaseExpiresAt, rawJSON(&t.Output), &phases, &t.Error, &t.CreatedAt, &t.UpdatedAt, &t.CompletedAt, &t.SchemaVersion); err != nil {
		return err
	}
	var err error
	t.Phases, err = decodePhases(t.ID, phases)
	return err
}

// decodePhases decodes a task's phases column (empty for none).
func decodePhases(taskID string, b []byte) ([]apiv1.TaskPhase, error) {
	phases := []apiv1.TaskPhase{}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &phases); err != nil {
			return nil, fmt.Errorf("task %s phases: %w", taskID, err)
		}
	}
	return phases, nil
}

// NewTask is a task to queue.
type NewTask struct {
	NodeID       string
	AllocationID string
	Type         string
	Payload      any
	TTL          time.Duration
	OutboxID     int64
}

// InsertTask queues a task; an outbox event produces at most one task (unique outbox_id).
func (t *Tx) InsertTask(ctx context.Context, nt NewTask) (string, error) {
	b, err := json.Marshal(nt.Payload)
	if err != nil {
		return "", err
	}
	var outbox any
	if nt.OutboxID > 0 {
		outbox = nt.OutboxID
	}
	var id string
	err = t.tx.QueryRow(ctx, `INSERT INTO node_tasks (node_id, allocation_id, type, payload, not_after, outbox_id)
		VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5::float8), $6) RETURNING id::text`,
		nt.NodeID, nullIfEmpty(nt.AllocationID), nt.Type, b, nt.TTL.Seconds(), outbox).Scan(&id)
	return id, translate(err)
}

// LeaseTask gives the node its oldest runnable task — queued, or leased with an expired
// lease (its host died) — for lease, bumping the attempt. SKIP LOCKED keeps two polls from
// taking the same task. ErrNotFound when none is runnable.
func (s *Store) LeaseTask(ctx context.Context, nodeID string, lease time.Duration) (TaskRecord, error) {
	trs, err := s.LeaseTasks(ctx, nodeID, lease, 1)
	if err == nil && len(trs) == 0 {
		err = ErrNotFound
	}
	if err != nil {
		return TaskRecord{}, err
	}
	return trs[0], nil
}

// LeaseTasks leases up to max of the node's oldest runnable tasks in one statement, oldest
// first (none: an empty slice). Only tasks whose type and schema version the node's hostd
// decodes, as its last heartbeat reported (gpuaas_host_decodes, migration 025), are leased;
// the others stay queued until the host is upgraded (or expire at their deadline).
func (s *Store) LeaseTasks(ctx context.Context, nodeID string, lease time.Duration, max int) ([]TaskRecord, error) {
	trs, err := queryAll(ctx, s.pool, scanTask, `UPDATE node_tasks SET status = 'leased', attempt = attempt + 1,
			lease_expires_at = now() + make_interval(secs => $2::float8), updated_at = now()
		WHERE id IN (SELECT id FROM node_tasks
		             WHERE node_id = $1 AND not_after > now() AND attempt < max_attempts
		               AND (status = 'queued' OR (status = 'leased' AND lease_expires_at < now()))
		               AND gpuaas_host_decodes((SELECT agent_facts FROM nodes WHERE id = $1), type, schema_version)
		             ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED)
		RETURNING `+taskColumns, nodeID, lease.Seconds(), max)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(trs, func(i, j int) bool { return trs[i].CreatedAt.Before(trs[j].CreatedAt) })
	return trs, nil
}

// ExtendLease keeps a long task leased while its host reports progress.
func (s *Store) ExtendLease(ctx context.Context, taskID, nodeID string, lease time.Duration, phases json.RawMessage) error {
	tag, err := s.pool.Exec(ctx, `UPDATE node_tasks SET lease_expires_at = now() + make_interval(secs => $3::float8),
			phases = coalesce($4, phases), updated_at = now()
		WHERE id = $1 AND node_id = $2 AND status = 'leased'`, taskID, nodeID, lease.Seconds(), []byte(phases))
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// CompleteTask records a task's result once. changed is false when the task was already
// final (a duplicate result is accepted and ignored).
func (t *Tx) CompleteTask(ctx context.Context, taskID, nodeID, status string, output, phases json.RawMessage, errMsg string) (TaskRecord, bool, error) {
	var tr TaskRecord
	err := scanTask(t.tx.QueryRow(ctx, `SELECT `+taskColumns+` FROM node_tasks WHERE id = $1 AND node_id = $2 FOR UPDATE`, taskID, nodeID), &tr)
	if err != nil {
		return tr, false, translate(err)
	}
	switch tr.Status {
	case "succeeded", "failed", "refused", "expired":
		return tr, false, nil
	}
	if len(phases) == 0 {
		phases = json.RawMessage(`[]`)
	}
	err = scanTask(t.tx.QueryRow(ctx, `UPDATE node_tasks SET status = $2, output = $3, phases = $4, error = $5,
			lease_expires_at = NULL, completed_at = now(), updated_at = now()
		WHERE id = $1 RETURNING `+taskColumns, taskID, status, []byte(output), []byte(phases), errMsg), &tr)
	return tr, err == nil, translate(err)
}

// ExpireTasks finalizes tasks past their deadline, or whose last allowed attempt's lease ran
// out, and returns them so their allocations can be failed.
func (t *Tx) ExpireTasks(ctx context.Context) ([]TaskRecord, error) {
	return queryAll(ctx, t.tx, scanTask, `UPDATE node_tasks SET status = 'expired', lease_expires_at = NULL,
			completed_at = now(), updated_at = now(),
			error = CASE WHEN not_after <= now() THEN 'task deadline passed' ELSE 'lease expired on the last allowed attempt' END
		WHERE status IN ('queued', 'leased')
		  AND (not_after <= now() OR (status = 'leased' AND lease_expires_at < now() AND attempt >= max_attempts))
		RETURNING `+taskColumns)
}

// TaskFilter narrows ListTasks.
type TaskFilter struct {
	NodeID       string
	AllocationID string
	Limit        int
}

// ListTasks returns tasks newest first.
func (s *Store) ListTasks(ctx context.Context, f TaskFilter) ([]TaskRecord, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 200
	}
	return queryAll(ctx, s.pool, scanTask, `SELECT `+taskColumns+` FROM node_tasks
		WHERE ($1::uuid IS NULL OR node_id = $1::uuid) AND ($2::uuid IS NULL OR allocation_id = $2::uuid)
		ORDER BY created_at DESC LIMIT $3`, optUUID(f.NodeID), optUUID(f.AllocationID), f.Limit)
}

// GetTask returns one task.
func (s *Store) GetTask(ctx context.Context, id string) (TaskRecord, error) {
	var tr TaskRecord
	err := scanTask(s.pool.QueryRow(ctx, `SELECT `+taskColumns+` FROM node_tasks WHERE id = $1::uuid`, uuidArg(id)), &tr)
	return tr, translate(err)
}

// OutboxEvent is a pending outbox row.
type OutboxEvent struct {
	ID          int64
	Topic       string
	AggregateID string
	NodeID      string
	Payload     json.RawMessage
}

// PendingOutbox locks up to limit undispatched events (SKIP LOCKED: several workers share).
func (t *Tx) PendingOutbox(ctx context.Context, limit int) ([]OutboxEvent, error) {
	return queryAll(ctx, t.tx, func(r pgx.Row, e *OutboxEvent) error {
		return r.Scan(&e.ID, &e.Topic, &e.AggregateID, &e.NodeID, &e.Payload)
	}, `SELECT id, topic, aggregate_id::text, coalesce(node_id::text, ''), payload FROM outbox
		WHERE dispatched_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, limit)
}

// DispatchInfo is what turning an allocation event into a host task needs.
type DispatchInfo struct {
	ID, NodeID, CapacityShape, Status string
	ResolvedProfile                   json.RawMessage
	ImageSnapshot                     json.RawMessage
	SSHPublicKeys                     []string
	Snapshots                         []json.RawMessage // live slot claims' device snapshots, by slot index
}

// DispatchInfos reads the allocations' plans in one query (an outbox batch at a time).
func (t *Tx) DispatchInfos(ctx context.Context, ids []string) (map[string]DispatchInfo, error) {
	rows, err := queryAll(ctx, t.tx, func(r pgx.Row, d *DispatchInfo) error {
		return r.Scan(&d.ID, &d.NodeID, &d.CapacityShape, &d.Status, &d.ResolvedProfile, &d.ImageSnapshot, &d.SSHPublicKeys, &d.Snapshots)
	}, `SELECT a.id::text, a.node_id::text, a.capacity_shape, a.status, coalesce(t.resolved_profile, a.resolved_profile),
			coalesce(t.image_snapshot, a.image_snapshot), coalesce(x.ssh_public_keys, a.ssh_public_keys),
			coalesce((SELECT array_agg(`+claimSnapshot+` ORDER BY (`+claimSnapshot+`->>'slot_index')::int)
			          FROM `+claimsFrom+`
			          WHERE c.allocation_id = a.id AND c.claim_kind = 'slot'
			            AND c.status <> 'released'), '{}') -- claims given up by a re-placement are not the plan
		FROM allocations a `+allocSnapshotsJoin+` WHERE a.id = ANY($1::uuid[])
		FOR SHARE OF a -- a concurrent cancel waits for the task to exist, or this sees it cancelled`, uuidsArg(ids))
	if err != nil {
		return nil, err
	}
	out := make(map[string]DispatchInfo, len(rows))
	for _, d := range rows {
		out[d.ID] = d
	}
	return out, nil
}

// LockForRelease is GetAllocationForUpdate for a release, in the same round trip: when the
// allocation (as tenantID may see it) is still requested, its tasks no host has taken yet are
// cancelled (they must never run: its slots go back to the pool), tasks are its tasks as
// they stand after that (newest first, as allocTasksSQL reads them; none when it is not
// requested), and leased reports whether its provisioning task is already with its host
// (then the release goes through the host, with a wipe).
func (t *Tx) LockForRelease(ctx context.Context, id, tenantID string) (rec AllocationRecord, tasks []TaskRecord, leased bool, err error) {
	rec, err = getAllocationBatch(ctx, t.tx, id, tenantID, true, func(b *pgx.Batch) {
		// The statement's snapshot is from before its own update: the cancelled tasks are
		// returned as the update left them, the others as the snapshot has them.
		b.Queue(`WITH a AS (SELECT id FROM allocations WHERE id = $1::uuid AND status = 'requested'
					AND ($2::uuid IS NULL OR tenant_id = $2::uuid)),
				cancelled AS (UPDATE node_tasks SET status = 'cancelled', error = 'allocation released before its host took the task',
						updated_at = now(), completed_at = now()
					WHERE allocation_id IN (SELECT id FROM a) AND status = 'queued' RETURNING *)
			SELECT `+allocTaskColumns+` FROM (
				SELECT * FROM cancelled
				UNION ALL
				SELECT * FROM node_tasks WHERE allocation_id IN (SELECT id FROM a) AND id NOT IN (SELECT id FROM cancelled)) t
			ORDER BY created_at DESC`,
			uuidArg(id), optUUID(tenantID))
	}, func(br pgx.BatchResults) (err error) {
		tasks, err = readTasks(br)
		return err
	})
	for _, tr := range tasks {
		leased = leased || tr.Type == "slice.vm_provision" && tr.Status == "leased"
	}
	if len(tasks) > allocTasksShown {
		tasks = tasks[:allocTasksShown]
	}
	return rec, tasks, leased, err
}

// CancelTask ends a leased task that must not run (its allocation is gone).
func (s *Store) CancelTask(ctx context.Context, id, reason string) error {
	_, err := s.pool.Exec(ctx, `UPDATE node_tasks SET status = 'cancelled', error = $2, updated_at = now(), completed_at = now()
		WHERE id = $1::uuid AND status IN ('queued', 'leased')`, uuidArg(id), reason)
	return translate(err)
}

// QueueTasks inserts tasks and closes outbox events, in one round trip.
func (t *Tx) QueueTasks(ctx context.Context, tasks []NewTask, dispatched []int64) error {
	b := &pgx.Batch{}
	for _, nt := range tasks {
		payload, err := json.Marshal(nt.Payload)
		if err != nil {
			return err
		}
		var outbox any
		if nt.OutboxID > 0 {
			outbox = nt.OutboxID
		}
		b.Queue(`INSERT INTO node_tasks (node_id, allocation_id, type, payload, not_after, outbox_id)
			VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5::float8), $6)`,
			nt.NodeID, nullIfEmpty(nt.AllocationID), nt.Type, payload, nt.TTL.Seconds(), outbox)
	}
	if len(dispatched) > 0 {
		b.Queue(`UPDATE outbox SET dispatched_at = now() WHERE id = ANY($1)`, dispatched)
	}
	return translate(t.tx.SendBatch(ctx, b).Close())
}

// MarkDispatched closes an outbox event.
func (t *Tx) MarkDispatched(ctx context.Context, id int64) error {
	_, err := t.tx.Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id = $1`, id)
	return translate(err)
}

// ClaimSnapshots returns the device snapshots of an allocation's claims (for task plans).
func (t *Tx) ClaimSnapshots(ctx context.Context, allocID string) ([]json.RawMessage, error) {
	return queryAll(ctx, t.tx, func(r pgx.Row, b *json.RawMessage) error { return r.Scan(b) },
		`SELECT `+claimSnapshot+` FROM `+claimsFrom+` WHERE c.allocation_id = $1 AND c.claim_kind = 'slot'
		 AND c.status <> 'released' -- claims given up by a re-placement (plan_invalid) are not the plan
		 ORDER BY (`+claimSnapshot+`->>'slot_index')::int`, allocID)
}

// Notify sends a PostgreSQL notification. Call it after the transaction that made the change
// has committed, never inside it (NOTIFY in the reserve transaction costs ~45% throughput).
func (s *Store) Notify(ctx context.Context, channel, payload string) error {
	_, err := s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload)
	return translate(err)
}

// Listen holds one connection LISTENing on channel and calls fn for each notification until
// ctx ends; it reconnects after connection loss.
// onReady (may be nil) runs each time the LISTEN is in place.
func (s *Store) Listen(ctx context.Context, channel string, fn func(payload string), onErr func(error), onReady func()) {
	s.ListenEach(ctx, map[string]func(string){channel: fn}, onErr, onReady)
}

// ListenEach is Listen on several channels over one connection (each costs the pool nothing
// more), calling each channel's fn.
func (s *Store) ListenEach(ctx context.Context, fns map[string]func(payload string), onErr func(error), onReady func()) {
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, fns, onReady)
		if ctx.Err() != nil {
			return
		}
		if onErr != nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second): // reconnect backoff
		}
	}
}

func (s *Store) listenOnce(ctx context.Context, fns map[string]func(string), onReady func()) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for channel := range fns {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return err
		}
	}
	if onReady != nil {
		onReady()
	}
	defer func() {
		// Leave the pooled connection clean.
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = conn.Exec(c, "UNLISTEN *")
	}()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		if fn := fns[n.Channel]; fn != nil {
			fn(n.Payload)
		}
	}
}

// LatestTask returns the newest task of a type for a node.
func (s *Store) LatestTask(ctx context.Context, nodeID, typ string) (TaskRecord, error) {
	var tr TaskRecord
	err := scanTask(s.pool.QueryRow(ctx, `SELECT `+taskColumns+` FROM node_tasks WHERE node_id = $1 AND type = $2
		ORDER BY created_at DESC LIMIT 1`, nodeID, typ), &tr)
	return tr, translate(err)
}

// LiveSliceAllocation is a slice allocation a host should be running or tearing down.
type LiveSliceAllocation struct {
	ID     string
	Status string
}

// LiveSliceAllocations lists a node's slice allocations in provisioning, active or releasing.
func (t *Tx) LiveSliceAllocations(ctx context.Context, nodeID string) ([]LiveSliceAllocation, error) {
	return queryAll(ctx, t.tx, func(r pgx.Row, a *LiveSliceAllocation) error { return r.Scan(&a.ID, &a.Status) },
		`SELECT id::text, status FROM allocations WHERE node_id = $1 AND capacity_shape = 'gpu_slice'
		 AND status IN ('provisioning', 'active', 'releasing') ORDER BY created_at, allocations.id`, nodeID)
}

// ReachableNodes lists active nodes whose last heartbeat is newer than since.
func (s *Store) ReachableNodes(ctx context.Context, since time.Time) ([]string, error) {
	return queryAll(ctx, s.pool, func(r pgx.Row, id *string) error { return r.Scan(id) },
		`SELECT id::text FROM nodes WHERE status = 'active' AND last_heartbeat_at > $1 ORDER BY nodes.id`, since)
}
