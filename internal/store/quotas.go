package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// quotaSQL reads quotas q with their tenant's name and current usage (tenant_quota_usage,
// migration 020); callers add the WHERE.
const quotaSQL = `SELECT q.tenant_id::text, t.name, q.sku, q.region, q.max_gpus, q.max_allocations,
		u.gpus, u.allocations, q.updated_at
	FROM tenant_quotas q JOIN tenants t ON t.id = q.tenant_id,
	     LATERAL tenant_quota_usage(q.tenant_id, q.sku, q.region) u `

func scanQuota(r pgx.Row, q *apiv1.Quota) error {
	var gpus, allocs int64
	err := r.Scan(&q.TenantID, &q.Tenant, &q.SKU, &q.Region, &q.MaxGPUs, &q.MaxAllocations, &gpus, &allocs, &q.UpdatedAt)
	q.UsedGPUs, q.UsedAllocs = int(gpus), int(allocs)
	return err
}

// SetQuota writes tenant's quota for sku in region ("" = every region), replacing any, and
// returns it with its usage. A quota below the usage is allowed: it refuses new creates until
// releases bring the usage under it.
func (t *Tx) SetQuota(ctx context.Context, tenantID string, set apiv1.QuotaSet, audit AuditRecord) (apiv1.Quota, error) {
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO tenant_quotas (tenant_id, sku, region, max_gpus, max_allocations)
		VALUES ($1::uuid, $2, $3, $4, $5)
		ON CONFLICT (tenant_id, sku, region) DO UPDATE
		SET max_gpus = EXCLUDED.max_gpus, max_allocations = EXCLUDED.max_allocations, updated_at = now()`,
		uuidArg(tenantID), set.SKU, set.Region, set.MaxGPUs, set.MaxAllocations)
	if err := queueAudit(b, audit); err != nil {
		return apiv1.Quota{}, err
	}
	b.Queue(quotaSQL+`WHERE q.tenant_id = $1::uuid AND q.sku = $2 AND q.region = $3`, uuidArg(tenantID), set.SKU, set.Region)
	br := t.tx.SendBatch(ctx, b)
	defer br.Close()
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return apiv1.Quota{}, translate(err)
		}
	}
	var q apiv1.Quota
	if err := scanQuota(br.QueryRow(), &q); err != nil {
		return q, translate(err)
	}
	return q, translate(br.Close())
}

// DeleteQuota removes tenant's quota for sku in region; ErrNotFound when there is none.
func (t *Tx) DeleteQuota(ctx context.Context, tenantID, sku, region string, audit AuditRecord) error {
	tag, err := t.tx.Exec(ctx, `DELETE FROM tenant_quotas WHERE tenant_id = $1::uuid AND sku = $2 AND region = $3`,
		uuidArg(tenantID), sku, region)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return t.Audit(ctx, audit)
}

// ListQuotas returns the quotas of tenantID ("" = every tenant) with their usage, by tenant
// name, SKU and region.
func (s *Store) ListQuotas(ctx context.Context, tenantID string) ([]apiv1.Quota, error) {
	return queryAll(ctx, s.pool, scanQuota, quotaSQL+`WHERE ($1::uuid IS NULL OR q.tenant_id = $1::uuid)
		ORDER BY t.name, q.sku, q.region`, optUUID(tenantID))
}
