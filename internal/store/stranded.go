package store

import (
	"context"
	"time"
)

// StrandedResults returns, for allocations still provisioning or releasing, their newest
// provisioning (resp. release) task when it has ended (succeeded, failed, refused, expired)
// more than settle ago: a recorded result whose effect on the allocation was never
// committed. Recording a result and driving the allocation are two transactions; normally the
// host's retry repairs a crash between them, but when the database itself loses the second
// (an asynchronous standby promoted before it had it) the host was already answered and
// never retries, and the allocation would wait forever. Results are looked at for ten
// minutes after settle: one that cannot be applied (the allocation moved on another way) is
// not retried for ever. The scan reads live allocations through their partial index
// (allocations_node), which holds only allocations not yet at rest.
func (s *Store) StrandedResults(ctx context.Context, settle time.Duration) ([]TaskRecord, error) {
	return queryAll(ctx, s.pool, scanTask, `SELECT `+taskColumns+` FROM node_tasks WHERE id IN (
		SELECT t.id FROM allocations a
		JOIN LATERAL (SELECT n.id, n.status, n.completed_at FROM node_tasks n WHERE n.allocation_id = a.id
			AND n.type = CASE a.status WHEN 'provisioning' THEN 'slice.vm_provision' ELSE 'slice.vm_release' END
			ORDER BY n.created_at DESC LIMIT 1) t ON true
		WHERE a.status NOT IN ('released', 'failed') AND a.status IN ('provisioning', 'releasing')
		  AND t.status IN ('succeeded', 'failed', 'refused', 'expired')
		  AND t.completed_at < now() - make_interval(secs => $1)
		  AND t.completed_at > now() - make_interval(secs => $1) - interval '10 minutes'
		LIMIT 100)
		ORDER BY completed_at`, settle.Seconds())
}
