package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Routes any authenticated caller (tenant or admin) may use.

// Whoami describes the caller's token.
func (c *Client) Whoami(ctx context.Context) (*apiv1.Whoami, error) {
	return get[apiv1.Whoami](ctx, c, "/api/v1/whoami", nil)
}

// ListSKUs lists the active SKUs (the tenant catalog). AdminListSKUs lists all of them.
func (c *Client) ListSKUs(ctx context.Context) ([]apiv1.SKU, error) {
	return list[apiv1.SKU](ctx, c, "/api/v1/skus", nil)
}

// Capacity reports raw and topology-safe capacity; empty sku or region means all.
func (c *Client) Capacity(ctx context.Context, sku, region string) ([]apiv1.Capacity, error) {
	q := url.Values{}
	if sku != "" {
		q.Set("sku", sku)
	}
	if region != "" {
		q.Set("region", region)
	}
	return list[apiv1.Capacity](ctx, c, "/api/v1/capacity", q)
}

// ExplainPlacement runs a placement dry run. An infeasible request is a normal answer
// (Feasible false with a reason), not an error.
func (c *Client) ExplainPlacement(ctx context.Context, req apiv1.PlacementRequest) (*apiv1.PlacementExplain, error) {
	return send[apiv1.PlacementExplain](ctx, c, http.MethodPost, "/api/v1/placement/explain", req)
}

// CreateAllocation creates an allocation. A non-empty idempotencyKey is sent as the
// Idempotency-Key header: repeating the call with the same key and body returns the first
// allocation instead of creating a second one.
func (c *Client) CreateAllocation(ctx context.Context, req apiv1.AllocationCreate, idempotencyKey string) (*apiv1.Allocation, error) {
	var out apiv1.Allocation
	r := request{method: http.MethodPost, path: "/api/v1/allocations", body: req}
	if idempotencyKey != "" {
		r.header = http.Header{"Idempotency-Key": {idempotencyKey}}
	}
	if _, err := c.do(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListAllocations lists the caller's allocations (admins: all), optionally in one status.
func (c *Client) ListAllocations(ctx context.Context, status string) ([]apiv1.Allocation, error) {
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	return list[apiv1.Allocation](ctx, c, "/api/v1/allocations", q)
}

// GetAllocation shows one allocation.
func (c *Client) GetAllocation(ctx context.Context, id string) (*apiv1.Allocation, error) {
	return get[apiv1.Allocation](ctx, c, "/api/v1/allocations/"+esc(id), nil)
}

// ReleaseAllocation asks for an allocation to be released.
func (c *Client) ReleaseAllocation(ctx context.Context, id string) (*apiv1.Allocation, error) {
	return send[apiv1.Allocation](ctx, c, http.MethodPost, "/api/v1/allocations/"+esc(id)+"/release", nil)
}
