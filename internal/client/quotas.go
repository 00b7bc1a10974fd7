package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Quotas and capacity reservations.

// ListQuotas lists quotas with their usage: a tenant's own; an admin's for tenant (id or
// name; "" = every tenant).
func (c *Client) ListQuotas(ctx context.Context, tenant string) ([]apiv1.Quota, error) {
	q := url.Values{}
	if tenant != "" {
		q.Set("tenant", tenant)
	}
	return list[apiv1.Quota](ctx, c, "/api/v1/quotas", q)
}

// SetQuota sets a tenant's (id or name) quota for a SKU and region (admin).
func (c *Client) SetQuota(ctx context.Context, tenant string, set apiv1.QuotaSet) (*apiv1.Quota, error) {
	return send[apiv1.Quota](ctx, c, http.MethodPut, "/api/v1/admin/tenants/"+url.PathEscape(tenant)+"/quotas", set)
}

// DeleteQuota removes a tenant's quota for a SKU and region (admin).
func (c *Client) DeleteQuota(ctx context.Context, tenant, sku, region string) error {
	q := url.Values{"sku": {sku}}
	if region != "" {
		q.Set("region", region)
	}
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/api/v1/admin/tenants/" + url.PathEscape(tenant) + "/quotas", query: q}, nil)
	return err
}

// CreateReservation reserves capacity.
func (c *Client) CreateReservation(ctx context.Context, req apiv1.ReservationCreate) (*apiv1.Reservation, error) {
	return send[apiv1.Reservation](ctx, c, http.MethodPost, "/api/v1/reservations", req)
}

// ListReservations lists reservations, newest first; activeOnly keeps those holding capacity.
func (c *Client) ListReservations(ctx context.Context, activeOnly bool) ([]apiv1.Reservation, error) {
	q := url.Values{}
	if activeOnly {
		q.Set("active", strconv.FormatBool(activeOnly))
	}
	return list[apiv1.Reservation](ctx, c, "/api/v1/reservations", q)
}

// GetReservation shows one reservation.
func (c *Client) GetReservation(ctx context.Context, id string) (*apiv1.Reservation, error) {
	return get[apiv1.Reservation](ctx, c, "/api/v1/reservations/"+url.PathEscape(id), nil)
}

// CancelReservation ends a reservation now.
func (c *Client) CancelReservation(ctx context.Context, id string) (*apiv1.Reservation, error) {
	return send[apiv1.Reservation](ctx, c, http.MethodPost, "/api/v1/reservations/"+url.PathEscape(id)+"/cancel", nil)
}
