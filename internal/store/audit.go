package store

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// AuditRecord is one privileged action, written in the same transaction as the action.
type AuditRecord struct {
	Actor      string
	ActorRole  string
	TenantID   string
	Action     string
	TargetKind string
	TargetID   string
	RequestID  string
	Details    any
}

// Audit appends to audit_log.
func (t *Tx) Audit(ctx context.Context, r AuditRecord) error {
	b := &pgx.Batch{}
	if err := queueAudit(b, r); err != nil {
		return err
	}
	return translate(t.tx.SendBatch(ctx, b).Close())
}

// queueAudit adds the audit record's insert to a batch.
func queueAudit(b *pgx.Batch, r AuditRecord) error {
	details := []byte("{}")
	if r.Details != nil {
		d, err := json.Marshal(r.Details)
		if err != nil {
			return err
		}
		details = d
	}
	b.Queue(`INSERT INTO audit_log (actor, actor_role, tenant_id, action, target_kind, target_id, request_id, details)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		r.Actor, r.ActorRole, nullIfEmpty(r.TenantID), r.Action, r.TargetKind, r.TargetID, r.RequestID, details)
	return nil
}

// AuditFilter narrows ListAudit.
type AuditFilter struct {
	Limit    int
	Action   string
	TargetID string
}

// ListAudit returns newest entries first.
func (s *Store) ListAudit(ctx context.Context, f AuditFilter) ([]apiv1.AuditEntry, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	rows, err := s.pool.Query(ctx, `SELECT id, at, actor, actor_role, coalesce(tenant_id::text, ''), action, target_kind,
			target_id, request_id, details
		FROM audit_log
		WHERE ($2 = '' OR action = $2) AND ($3 = '' OR target_id = $3)
		ORDER BY id DESC LIMIT $1`, f.Limit, f.Action, f.TargetID)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	out := []apiv1.AuditEntry{}
	for rows.Next() {
		var e apiv1.AuditEntry
		if err := rows.Scan(&e.ID, &e.At, &e.Actor, &e.ActorRole, &e.TenantID, &e.Action, &e.TargetKind,
			&e.TargetID, &e.RequestID, &e.Details); err != nil {
			return nil, translate(err)
		}
		out = append(out, e)
	}
	return out, translate(rows.Err())
}
