package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Admin routes that drive host daemons through signed tasks: node tasks, bootstrap tokens,
// topology discovery, slot approval, storage transition and repair wipes.

// ListTasks lists node tasks, newest first, optionally only those of one node (id or name)
// or one allocation.
func (c *Client) ListTasks(ctx context.Context, node, allocation string) ([]apiv1.Task, error) {
	v := url.Values{}
	if node != "" {
		v.Set("node", node)
	}
	if allocation != "" {
		v.Set("allocation", allocation)
	}
	return list[apiv1.Task](ctx, c, "/api/v1/tasks", v)
}

// GetTask shows one node task with its phases.
func (c *Client) GetTask(ctx context.Context, id string) (*apiv1.Task, error) {
	return get[apiv1.Task](ctx, c, "/api/v1/tasks/"+esc(id), nil)
}

// NewBootstrapToken issues a fresh one-time enrollment token for a node's host daemon.
func (c *Client) NewBootstrapToken(ctx context.Context, node string) (*apiv1.BootstrapToken, error) {
	return send[apiv1.BootstrapToken](ctx, c, http.MethodPost, nodePath(node)+"/bootstrap-token", nil)
}

// DiscoverTopology queues a slice-topology discovery on a node.
func (c *Client) DiscoverTopology(ctx context.Context, node string) (*apiv1.Discovery, error) {
	return send[apiv1.Discovery](ctx, c, http.MethodPost, nodePath(node)+"/slice-topology/discovery", nil)
}

// GetTopology returns a node's latest discovery.
func (c *Client) GetTopology(ctx context.Context, node string) (*apiv1.Discovery, error) {
	return get[apiv1.Discovery](ctx, c, nodePath(node)+"/slice-topology/discovery", nil)
}

// ApproveSlots promotes discovered candidates into approved slots (or diffs with DryRun).
func (c *Client) ApproveSlots(ctx context.Context, node string, req apiv1.SlotApprove) (*apiv1.SlotApplyResult, error) {
	return send[apiv1.SlotApplyResult](ctx, c, http.MethodPost, nodePath(node)+"/slots/approve", req)
}

// StorageTransition queues a storage transition on a node (a plan unless req.Apply) and
// returns the task id.
func (c *Client) StorageTransition(ctx context.Context, node string, req apiv1.StorageTransitionRequest) (string, error) {
	out, err := send[map[string]string](ctx, c, http.MethodPost, nodePath(node)+"/storage-transition", req)
	if err != nil {
		return "", err
	}
	return (*out)["task_id"], nil
}

// WipeSlot queues a repair wipe and verify of a cleanup_blocked slot (a plan unless apply)
// and returns the task id.
func (c *Client) WipeSlot(ctx context.Context, node string, index int, apply bool) (string, error) {
	body := struct {
		Apply bool `json:"apply"`
	}{apply}
	out, err := send[map[string]string](ctx, c, http.MethodPost, slotPath(node, index)+"/wipe", body)
	if err != nil {
		return "", err
	}
	return (*out)["task_id"], nil
}

// Reconcile queues slice.reconcile on a node.
func (c *Client) Reconcile(ctx context.Context, node string) (*apiv1.Reconcile, error) {
	return send[apiv1.Reconcile](ctx, c, http.MethodPost, nodePath(node)+"/reconcile", nil)
}

// GetReconcile returns a node's latest reconcile and its drift report.
func (c *Client) GetReconcile(ctx context.Context, node string) (*apiv1.Reconcile, error) {
	return get[apiv1.Reconcile](ctx, c, nodePath(node)+"/reconcile", nil)
}
