package alloc

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// SetQuota sets a tenant's quota for one SKU in one region ("" = every region together);
// admins only. A nil limit is no limit. The database enforces it on every later create
// (migration 020); a quota under the current usage refuses new creates until releases bring
// the usage under it.
func (s *Service) SetQuota(ctx context.Context, actor Actor, tenantID string, set apiv1.QuotaSet) (apiv1.Quota, error) {
	if !actor.isAdmin() {
		return apiv1.Quota{}, &apiv1.Error{Code: apiv1.CodeForbidden, Message: "quotas are set by admins"}
	}
	if err := validateQuota(tenantID, set); err != nil {
		return apiv1.Quota{}, err
	}
	var out apiv1.Quota
	err := s.st.InTx(ctx, func(tx *store.Tx) error {
		rec := actor.audit("quota.set", "tenant", tenantID, map[string]any{"sku": set.SKU, "region": set.Region,
			"max_gpus": set.MaxGPUs, "max_allocations": set.MaxAllocations})
		rec.TenantID = tenantID
		var err error
		out, err = tx.SetQuota(ctx, tenantID, set, rec)
		return err
	})
	return out, err
}

// DeleteQuota removes a tenant's quota for one SKU and region; admins only.
func (s *Service) DeleteQuota(ctx context.Context, actor Actor, tenantID, sku, region string) error {
	if !actor.isAdmin() {
		return &apiv1.Error{Code: apiv1.CodeForbidden, Message: "quotas are set by admins"}
	}
	if !store.IsUUID(tenantID) {
		return &apiv1.Error{Code: apiv1.CodeNotFound, Message: "tenant not found"}
	}
	err := s.st.InTx(ctx, func(tx *store.Tx) error {
		rec := actor.audit("quota.delete", "tenant", tenantID, map[string]any{"sku": sku, "region": region})
		rec.TenantID = tenantID
		return tx.DeleteQuota(ctx, tenantID, sku, region, rec)
	})
	if errors.Is(err, store.ErrNotFound) {
		return &apiv1.Error{Code: apiv1.CodeNotFound, Message: fmt.Sprintf("no quota for %s in region %q", sku, region)}
	}
	return err
}

// Quotas lists quotas with their usage: a tenant's own; an admin's for tenantID ("" = all).
func (s *Service) Quotas(ctx context.Context, actor Actor, tenantID string) ([]apiv1.Quota, error) {
	if !actor.isAdmin() {
		tenantID = actor.TenantID
	} else if tenantID != "" && !store.IsUUID(tenantID) {
		return nil, invalid("tenant_id %q is not a tenant id", tenantID)
	}
	out, err := s.st.ListQuotas(ctx, tenantID)
	if out == nil {
		out = []apiv1.Quota{}
	}
	return out, err
}

func validateQuota(tenantID string, set apiv1.QuotaSet) error {
	switch {
	case !store.IsUUID(tenantID):
		return &apiv1.Error{Code: apiv1.CodeNotFound, Message: "tenant not found"}
	case set.SKU == "":
		return invalid("sku is required")
	case set.MaxGPUs == nil && set.MaxAllocations == nil:
		return invalid("a quota needs max_gpus, max_allocations or both")
	case set.MaxGPUs != nil && (*set.MaxGPUs < 0 || *set.MaxGPUs > 1_000_000):
		return invalid("max_gpus must be between 0 and 1000000")
	case set.MaxAllocations != nil && (*set.MaxAllocations < 0 || *set.MaxAllocations > 1_000_000):
		return invalid("max_allocations must be between 0 and 1000000")
	case len(set.Region) > 63:
		return invalid("region is longer than 63 characters")
	}
	return nil
}

// quotaError is the client's quota_exceeded for the database's refusal (store.ErrQuota), with
// the quota's limit and usage; other errors pass unchanged.
func quotaError(err error) error {
	var dbe *store.DBError
	if !errors.As(err, &dbe) || !errors.Is(err, store.ErrQuota) {
		return err
	}
	details := map[string]any{}
	for k, v := range dbe.Quota {
		if f, ok := v.(float64); ok && f == float64(int64(f)) {
			v = int64(f)
		}
		details[k] = v
	}
	return &apiv1.Error{Code: apiv1.CodeQuotaExceeded, Message: dbe.Detail, Details: details}
}
