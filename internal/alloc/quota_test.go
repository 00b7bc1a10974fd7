package alloc_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func (b *testBundle) setQuota(tenantID, region string, gpus, allocs *int) apiv1.Quota {
	b.t.Helper()
	q, err := b.svc.SetQuota(b.ctx, b.admin, tenantID, apiv1.QuotaSet{SKU: "h200-sxm-slice", Region: region, MaxGPUs: gpus, MaxAllocations: allocs})
	if err != nil {
		b.t.Fatal(err)
	}
	return q
}

func intp(v int) *int { return &v }

// quotaExceeded asserts err is quota_exceeded and returns its details.
func quotaExceeded(t *testing.T, err error) map[string]any {
	t.Helper()
	var ae *apiv1.Error
	if !errors.As(err, &ae) || ae.Code != apiv1.CodeQuotaExceeded {
		t.Fatalf("want quota_exceeded, got %v", err)
	}
	return ae.Details
}

// 64 concurrent creates against a quota of 10 GPUs, on a fleet with room for all of them:
// exactly 10 succeed, every other one is quota_exceeded with the limit and the usage, and a
// release frees its quota at once.
func TestQuotaHoldsUnderConcurrentCreates(t *testing.T) {
	b := setup(t)
	for i := range 10 {
		b.addNode(fmt.Sprintf("q%d", i), i)
	}
	b.refreshCapacity()
	b.setQuota(b.tenant.TenantID, "", intp(10), nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok []apiv1.Allocation
	var refused []map[string]any
	var other []error
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := b.create(b.tenant, "h200-sxm-slice", 1)
			mu.Lock()
			defer mu.Unlock()
			var ae *apiv1.Error
			switch {
			case err == nil:
				ok = append(ok, a)
			case errors.As(err, &ae) && ae.Code == apiv1.CodeQuotaExceeded:
				refused = append(refused, ae.Details)
			default:
				other = append(other, err)
			}
		}()
	}
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("%d creates failed otherwise than quota_exceeded, first: %v", len(other), other[0])
	}
	if len(ok) != 10 || len(refused) != 54 {
		t.Fatalf("%d creates succeeded and %d were refused; want 10 and 54", len(ok), len(refused))
	}
	for _, d := range refused {
		if d["limit"] != "gpus" || d["max"] != int64(10) || d["used"] != int64(10) || d["requested"] != int64(1) {
			t.Fatalf("refusal details = %v; want limit gpus, max 10, used 10, requested 1", d)
		}
	}
	// The other tenant has no quota: not limited by this one.
	if _, err := b.create(b.other, "h200-sxm-slice", 2); err != nil {
		t.Fatalf("a tenant without a quota: %v", err)
	}
	if _, err := b.svc.Release(b.ctx, b.tenant, ok[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.create(b.tenant, "h200-sxm-slice", 1); err != nil {
		t.Fatalf("a create after a release: %v", err)
	}
	quotaExceeded(t, func() error { _, err := b.create(b.tenant, "h200-sxm-slice", 1); return err }())
	qs, err := b.svc.Quotas(b.ctx, b.tenant, "")
	if err != nil || len(qs) != 1 || qs[0].UsedGPUs != 10 || qs[0].UsedAllocs != 10 || *qs[0].MaxGPUs != 10 {
		t.Fatalf("tenant's quotas = %+v, %v; want one, 10 of 10 GPUs used in 10 allocations", qs, err)
	}
	b.invariants()
}

// A live-allocation limit counts allocations whatever their size, per region when the quota
// names one; a region-wide quota leaves other regions alone.
func TestQuotaLimitsAllocationsPerRegion(t *testing.T) {
	b := setup(t)
	b.addNode("east", 1, withRegion("east"))
	b.addNode("west", 2, withRegion("west"))
	b.refreshCapacity()
	b.setQuota(b.tenant.TenantID, "east", nil, intp(2))
	create := func(region string) error {
		_, _, err := b.svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1, Region: region}, "")
		return err
	}
	for range 2 {
		if err := create("east"); err != nil {
			t.Fatal(err)
		}
	}
	d := quotaExceeded(t, create("east"))
	if d["limit"] != "allocations" || d["region"] != "east" || d["max"] != int64(2) || d["used"] != int64(2) {
		t.Fatalf("details = %v", d)
	}
	for range 3 {
		if err := create("west"); err != nil {
			t.Fatalf("west has no quota: %v", err)
		}
	}
	// Tenants cannot set quotas; bad limits are refused in words.
	if _, err := b.svc.SetQuota(b.ctx, b.tenant, b.tenant.TenantID, apiv1.QuotaSet{SKU: "h200-sxm-slice", MaxGPUs: intp(100)}); err == nil {
		t.Fatal("a tenant set its own quota")
	}
	if _, err := b.svc.SetQuota(b.ctx, b.admin, b.tenant.TenantID, apiv1.QuotaSet{SKU: "h200-sxm-slice", MaxGPUs: intp(-1)}); err == nil {
		t.Fatal("a negative limit was accepted")
	}
	if _, err := b.svc.SetQuota(b.ctx, b.admin, b.tenant.TenantID, apiv1.QuotaSet{SKU: "no-such-sku", MaxGPUs: intp(1)}); err == nil {
		t.Fatal("a quota for an unknown SKU was accepted")
	}
}
