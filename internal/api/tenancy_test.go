package api_test

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Quotas over HTTPS: set by tenant name, read by the tenant with its usage, refused past the
// limit with 409 quota_exceeded and the numbers; bad input is 400 in our words, never a 500.
func TestQuotaOverHTTP(t *testing.T) {
	b := setup(t)
	b.world()
	two := 2
	var q apiv1.Quota
	b.must("PUT", "/api/v1/admin/tenants/acme/quotas", b.admin, apiv1.QuotaSet{SKU: "h200-sxm-slice", MaxGPUs: &two}, 200, &q)
	if q.TenantID != b.tenID || q.MaxGPUs == nil || *q.MaxGPUs != 2 || q.MaxAllocations != nil || q.UsedGPUs != 0 {
		t.Fatalf("quota = %+v", q)
	}
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2}, 201, nil)
	code, body := b.do("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1})
	e := apiError(t, body)
	if code != 409 || e.Code != apiv1.CodeQuotaExceeded || e.Details["max"] != float64(2) || e.Details["used"] != float64(2) || e.Details["limit"] != "gpus" {
		t.Fatalf("create past the quota = %d %s", code, body)
	}
	var qs apiv1.List[apiv1.Quota]
	b.must("GET", "/api/v1/quotas", b.tenant, nil, 200, &qs)
	if len(qs.Items) != 1 || qs.Items[0].UsedGPUs != 2 || qs.Items[0].UsedAllocs != 1 {
		t.Fatalf("tenant's quotas = %+v", qs.Items)
	}
	b.must("GET", "/api/v1/quotas", b.other, nil, 200, &qs)
	if len(qs.Items) != 0 {
		t.Fatalf("another tenant sees %+v", qs.Items)
	}
	for _, c := range []struct {
		method, path string
		body         any
		code         int
		msg          string
	}{
		{"PUT", "/api/v1/admin/tenants/acme/quotas", apiv1.QuotaSet{SKU: "h200-sxm-slice"}, 400, "max_gpus, max_allocations or both"},
		{"PUT", "/api/v1/admin/tenants/acme/quotas", map[string]any{"sku": "h200-sxm-slice", "max_gpus": -1}, 400, "between 0 and"},
		{"PUT", "/api/v1/admin/tenants/acme/quotas", apiv1.QuotaSet{SKU: "no-such-sku", MaxGPUs: &two}, 400, "SKU not found"},
		{"PUT", "/api/v1/admin/tenants/nobody/quotas", apiv1.QuotaSet{SKU: "h200-sxm-slice", MaxGPUs: &two}, 404, "tenant not found"},
		{"PUT", "/api/v1/admin/tenants/acme/quotas", map[string]any{"sku": "h200-sxm-slice", "max_gpus": 1, "gpus": 1}, 400, "unknown field"},
		{"DELETE", "/api/v1/admin/tenants/acme/quotas", nil, 400, "sku is required"},
		{"DELETE", "/api/v1/admin/tenants/acme/quotas?sku=h200-sxm-slice&region=nowhere", nil, 404, "no quota"},
		{"GET", "/api/v1/quotas?tenat=acme", nil, 400, "unknown query parameter"},
		{"GET", "/api/v1/reservations?active=maybe", nil, 400, "active must be true or false"},
		{"POST", "/api/v1/reservations", apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 3}, 409, "allows"},
		{"GET", "/api/v1/reservations/not-an-id", nil, 404, "reservation not found"},
		{"POST", "/api/v1/allocations", apiv1.AllocationCreate{GPUs: 1, ReservationID: "not-an-id"}, 400, "not a reservation id"},
	} {
		token := b.admin
		if strings.Contains(c.path, "reservations") || c.path == "/api/v1/allocations" {
			token = b.tenant
		}
		code, body := b.do(c.method, c.path, token, c.body)
		if code != c.code || !strings.Contains(apiError(t, body).Message, c.msg) {
			t.Errorf("%s %s %v = %d %s; want %d %q", c.method, c.path, c.body, code, body, c.code, c.msg)
		}
	}
	b.must("DELETE", "/api/v1/admin/tenants/acme/quotas?sku=h200-sxm-slice", b.admin, nil, 200, nil)
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, nil)
}
