package client

import (
	"context"
	"net/http"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Slot and fleet health (admin), and a release with a tenant's report.

// FleetHealth is the fleet's health by node, worst first.
func (c *Client) FleetHealth(ctx context.Context) ([]apiv1.NodeHealth, error) {
	return list[apiv1.NodeHealth](ctx, c, "/api/v1/admin/health", nil)
}

// HealthPolicy is the signal -> action policy table.
func (c *Client) HealthPolicy(ctx context.Context) ([]apiv1.HealthRule, error) {
	return list[apiv1.HealthRule](ctx, c, "/api/v1/admin/health/policy", nil)
}

// SlotHealth is a slot's health, history and validations.
func (c *Client) SlotHealth(ctx context.Context, node string, index int) (*apiv1.SlotHealth, error) {
	return get[apiv1.SlotHealth](ctx, c, slotPath(node, index)+"/health", nil)
}

// QuarantineSlot takes a slot out of sale until an operator clears it.
func (c *Client) QuarantineSlot(ctx context.Context, node string, index int, reason string) (*apiv1.HealthEvent, error) {
	return send[apiv1.HealthEvent](ctx, c, http.MethodPost, slotPath(node, index)+"/quarantine", apiv1.SlotHealthChange{Reason: reason})
}

// ClearSlot returns a slot to healthy (a quarantine needs a passed validation since it began).
func (c *Client) ClearSlot(ctx context.Context, node string, index int, reason string) (*apiv1.HealthEvent, error) {
	return send[apiv1.HealthEvent](ctx, c, http.MethodPost, slotPath(node, index)+"/clear", apiv1.SlotHealthChange{Reason: reason})
}

// ReleaseAllocationWithReport releases an allocation reporting a problem with it: its slots
// are held for operator review.
func (c *Client) ReleaseAllocationWithReport(ctx context.Context, id, report string) (*apiv1.Allocation, error) {
	return send[apiv1.Allocation](ctx, c, http.MethodPost, "/api/v1/allocations/"+esc(id)+"/release", apiv1.ReleaseRequest{Report: report})
}

// ValidateSlot queues a quick validation of an idle slot and returns its task id.
func (c *Client) ValidateSlot(ctx context.Context, node string, index int) (string, error) {
	out, err := send[map[string]string](ctx, c, http.MethodPost, slotPath(node, index)+"/validate", nil)
	if err != nil {
		return "", err
	}
	return (*out)["task_id"], nil
}
