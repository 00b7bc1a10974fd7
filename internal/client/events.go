package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// EventQuery selects a page of events: after a cursor, or since a time ("" and zero: from the
// start of the log), waiting up to Wait for the first one.
type EventQuery struct {
	After string
	Since string // RFC 3339 or a duration ago (1h)
	Limit int
	Wait  time.Duration
}

// Events reads one page of the caller's events.
func (c *Client) Events(ctx context.Context, q EventQuery) (*apiv1.EventPage, error) {
	v := url.Values{}
	if q.After != "" {
		v.Set("after", q.After)
	}
	if q.Since != "" {
		v.Set("since", q.Since)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Wait > 0 {
		v.Set("wait", q.Wait.String())
	}
	return get[apiv1.EventPage](ctx, c, "/api/v1/events", v)
}

// DrainNodeWithNotice drains a node and sends a maintenance notice (deadline notice from
// now, reason) to every tenant with an allocation on it.
func (c *Client) DrainNodeWithNotice(ctx context.Context, node string, notice time.Duration, reason string) (*apiv1.Node, error) {
	return send[apiv1.Node](ctx, c, http.MethodPost, nodePath(node)+"/drain", apiv1.MaintenanceRequest{Notice: notice.String(), Reason: reason})
}

// ListMaintenance lists maintenance notices (tenants: those about their allocations).
func (c *Client) ListMaintenance(ctx context.Context) ([]apiv1.MaintenanceNotice, error) {
	return list[apiv1.MaintenanceNotice](ctx, c, "/api/v1/maintenance", nil)
}

// CreateWebhook registers an HTTPS endpoint for the caller's events; the answer holds the
// signing secret, shown only this once.
func (c *Client) CreateWebhook(ctx context.Context, in apiv1.WebhookCreate) (*apiv1.Webhook, error) {
	return send[apiv1.Webhook](ctx, c, http.MethodPost, "/api/v1/webhooks", in)
}

// ListWebhooks lists the caller's webhooks with their delivery counts.
func (c *Client) ListWebhooks(ctx context.Context) ([]apiv1.Webhook, error) {
	return list[apiv1.Webhook](ctx, c, "/api/v1/webhooks", nil)
}

// DeleteWebhook removes a webhook; its pending deliveries stop.
func (c *Client) DeleteWebhook(ctx context.Context, id string) (*apiv1.Webhook, error) {
	return send[apiv1.Webhook](ctx, c, http.MethodDelete, "/api/v1/webhooks/"+url.PathEscape(id), nil)
}

// WebhookDeliveries lists a webhook's deliveries, newest first, with their attempts.
func (c *Client) WebhookDeliveries(ctx context.Context, id, status string) ([]apiv1.WebhookDelivery, error) {
	v := url.Values{}
	if status != "" {
		v.Set("status", status)
	}
	return list[apiv1.WebhookDelivery](ctx, c, "/api/v1/webhooks/"+url.PathEscape(id)+"/deliveries", v)
}
