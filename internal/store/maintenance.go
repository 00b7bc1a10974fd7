package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// CreateMaintenanceNotice records maintenance of a node due at deadline and tells every
// tenant with a live allocation on it, in one statement: the notice, the allocations it
// names, and one maintenance.scheduled event per allocation (tenant-visible: the notice, the
// allocation, the deadline and the reason; the node only in the operator's view).
func (t *Tx) CreateMaintenanceNotice(ctx context.Context, nodeID, reason string, deadline time.Time, by string) (apiv1.MaintenanceNotice, error) {
	var n apiv1.MaintenanceNotice
	err := t.tx.QueryRow(ctx, `WITH n AS (
			INSERT INTO maintenance_notices (node_id, reason, deadline, created_by) VALUES ($1, $2, $3, $4)
			RETURNING id, node_id, reason, deadline, created_at),
		a AS (
			INSERT INTO maintenance_notice_allocations (notice_id, allocation_id, tenant_id)
			SELECT n.id, al.id, al.tenant_id FROM n JOIN allocations al ON al.node_id = n.node_id
			WHERE al.status IN ('requested', 'provisioning', 'active')
			RETURNING notice_id, allocation_id, tenant_id),
		e AS (
			INSERT INTO events (type, tenant_id, allocation_id, node_id, data)
			SELECT 'maintenance.scheduled', a.tenant_id, a.allocation_id, n.node_id,
			       jsonb_build_object('notice_id', n.id, 'allocation_id', a.allocation_id, 'deadline', n.deadline, 'reason', n.reason)
			FROM a, n)
		SELECT n.id::text, n.node_id::text, n.reason, n.deadline, n.created_at,
		       coalesce((SELECT array_agg(allocation_id::text ORDER BY allocation_id) FROM a), '{}')
		FROM n`, uuidArg(nodeID), reason, deadline, by).Scan(&n.ID, &n.NodeID, &n.Reason, &n.Deadline, &n.CreatedAt, &n.Allocations)
	return n, translate(err)
}

// ListMaintenance lists maintenance notices, latest deadline first: for a tenant those that
// name its allocations, without the node; for operators (tenantID "") all, with the node.
func (s *Store) ListMaintenance(ctx context.Context, tenantID string) ([]apiv1.MaintenanceNotice, error) {
	if tenantID != "" {
		return queryAll(ctx, s.pool, func(r pgx.Row, n *apiv1.MaintenanceNotice) error {
			return r.Scan(&n.ID, &n.Reason, &n.Deadline, &n.CreatedAt, &n.Allocations)
		}, `SELECT n.id::text, n.reason, n.deadline, n.created_at, array_agg(m.allocation_id::text ORDER BY m.allocation_id)
			FROM maintenance_notices n JOIN maintenance_notice_allocations m ON m.notice_id = n.id
			WHERE m.tenant_id = $1::uuid
			GROUP BY n.id ORDER BY n.deadline DESC, n.id LIMIT 500`, uuidArg(tenantID))
	}
	return queryAll(ctx, s.pool, func(r pgx.Row, n *apiv1.MaintenanceNotice) error {
		return r.Scan(&n.ID, &n.NodeID, &n.NodeName, &n.Reason, &n.Deadline, &n.CreatedAt, &n.Allocations)
	}, `SELECT n.id::text, n.node_id::text, nd.name, n.reason, n.deadline, n.created_at,
			coalesce(array_agg(m.allocation_id::text ORDER BY m.allocation_id) FILTER (WHERE m.allocation_id IS NOT NULL), '{}')
		FROM maintenance_notices n JOIN nodes nd ON nd.id = n.node_id
		LEFT JOIN maintenance_notice_allocations m ON m.notice_id = n.id
		GROUP BY n.id, nd.name ORDER BY n.deadline DESC, n.id LIMIT 500`)
}
