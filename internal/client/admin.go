package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Admin routes: nodes, slots, catalog, tenants, tokens, audit.

func nodePath(node string) string { return "/api/v1/admin/nodes/" + esc(node) }

func slotPath(node string, index int) string {
	return nodePath(node) + "/slots/" + strconv.Itoa(index)
}

// CreateNode registers a node. The answer carries its one-time bootstrap token.
func (c *Client) CreateNode(ctx context.Context, req apiv1.NodeCreate) (*apiv1.Node, error) {
	return send[apiv1.Node](ctx, c, http.MethodPost, "/api/v1/admin/nodes", req)
}

// ListNodes lists nodes with their mode and slot summary.
func (c *Client) ListNodes(ctx context.Context) ([]apiv1.Node, error) {
	return list[apiv1.Node](ctx, c, "/api/v1/admin/nodes", nil)
}

// GetNode shows a node by id or name.
func (c *Client) GetNode(ctx context.Context, node string) (*apiv1.Node, error) {
	return get[apiv1.Node](ctx, c, nodePath(node), nil)
}

// DrainNode stops new placements on a node; live allocations continue.
func (c *Client) DrainNode(ctx context.Context, node string) (*apiv1.Node, error) {
	return send[apiv1.Node](ctx, c, http.MethodPost, nodePath(node)+"/drain", nil)
}

// UndrainNode allows new placements on a node again.
func (c *Client) UndrainNode(ctx context.Context, node string) (*apiv1.Node, error) {
	return send[apiv1.Node](ctx, c, http.MethodPost, nodePath(node)+"/undrain", nil)
}

// ListSlots lists a node's slots.
func (c *Client) ListSlots(ctx context.Context, node string) ([]apiv1.Slot, error) {
	return list[apiv1.Slot](ctx, c, nodePath(node)+"/slots", nil)
}

// ApplySlots applies a declarative slot map, or with req.DryRun only diffs it.
func (c *Client) ApplySlots(ctx context.Context, node string, req apiv1.SlotApply) (*apiv1.SlotApplyResult, error) {
	return send[apiv1.SlotApplyResult](ctx, c, http.MethodPut, nodePath(node)+"/slots", req)
}

// DisableSlot takes a slot out of service.
func (c *Client) DisableSlot(ctx context.Context, node string, index int) (*apiv1.Slot, error) {
	return send[apiv1.Slot](ctx, c, http.MethodPost, slotPath(node, index)+"/disable", nil)
}

// EnableSlot returns a disabled slot to service.
func (c *Client) EnableSlot(ctx context.Context, node string, index int) (*apiv1.Slot, error) {
	return send[apiv1.Slot](ctx, c, http.MethodPost, slotPath(node, index)+"/enable", nil)
}

// AdminListSKUs lists every SKU, inactive ones included.
func (c *Client) AdminListSKUs(ctx context.Context) ([]apiv1.SKU, error) {
	return list[apiv1.SKU](ctx, c, "/api/v1/admin/skus", nil)
}

// CreateSKU adds a SKU.
func (c *Client) CreateSKU(ctx context.Context, s apiv1.SKU) (*apiv1.SKU, error) {
	return send[apiv1.SKU](ctx, c, http.MethodPost, "/api/v1/admin/skus", s)
}

// PatchSKU updates a SKU's mutable fields.
func (c *Client) PatchSKU(ctx context.Context, sku string, p apiv1.SKUPatch) (*apiv1.SKU, error) {
	return send[apiv1.SKU](ctx, c, http.MethodPatch, "/api/v1/admin/skus/"+esc(sku), p)
}

func imagePath(idOrSlug string) string { return "/api/v1/admin/os-images/" + esc(idOrSlug) }

// ListImages lists the OS image catalog.
func (c *Client) ListImages(ctx context.Context) ([]apiv1.OSImage, error) {
	return list[apiv1.OSImage](ctx, c, "/api/v1/admin/os-images", nil)
}

// CreateImage registers an OS image; the server ignores id and timestamps.
func (c *Client) CreateImage(ctx context.Context, im apiv1.OSImage) (*apiv1.OSImage, error) {
	return send[apiv1.OSImage](ctx, c, http.MethodPost, "/api/v1/admin/os-images", im)
}

// GetImage shows an image by id or slug.
func (c *Client) GetImage(ctx context.Context, idOrSlug string) (*apiv1.OSImage, error) {
	return get[apiv1.OSImage](ctx, c, imagePath(idOrSlug), nil)
}

// PatchImage updates an image's mutable fields.
func (c *Client) PatchImage(ctx context.Context, idOrSlug string, p apiv1.OSImagePatch) (*apiv1.OSImage, error) {
	return send[apiv1.OSImage](ctx, c, http.MethodPatch, imagePath(idOrSlug), p)
}

// RetireImage retires an image: no new allocations use it, existing ones keep their snapshot.
func (c *Client) RetireImage(ctx context.Context, idOrSlug string) (*apiv1.OSImage, error) {
	return send[apiv1.OSImage](ctx, c, http.MethodDelete, imagePath(idOrSlug), nil)
}

// DeleteImage hard-deletes an image no allocation ever referenced; it returns what was deleted.
func (c *Client) DeleteImage(ctx context.Context, idOrSlug string) (*apiv1.OSImage, error) {
	var out apiv1.OSImage
	r := request{method: http.MethodDelete, path: imagePath(idOrSlug), query: url.Values{"hard": {"true"}}}
	if _, err := c.do(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AuditQuery filters the audit log; zero values mean "no filter" (Limit: server default).
type AuditQuery struct {
	Limit    int
	Action   string
	TargetID string
}

// ListAudit lists audit entries, newest first.
func (c *Client) ListAudit(ctx context.Context, q AuditQuery) ([]apiv1.AuditEntry, error) {
	v := url.Values{}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Action != "" {
		v.Set("action", q.Action)
	}
	if q.TargetID != "" {
		v.Set("target_id", q.TargetID)
	}
	return list[apiv1.AuditEntry](ctx, c, "/api/v1/admin/audit", v)
}

// CreateTenant creates a tenant.
func (c *Client) CreateTenant(ctx context.Context, name string) (*apiv1.Tenant, error) {
	body := struct {
		Name string `json:"name"`
	}{name}
	return send[apiv1.Tenant](ctx, c, http.MethodPost, "/api/v1/admin/tenants", body)
}

// ListTenants lists tenants.
func (c *Client) ListTenants(ctx context.Context) ([]apiv1.Tenant, error) {
	return list[apiv1.Tenant](ctx, c, "/api/v1/admin/tenants", nil)
}

// ListTokens lists API tokens (never their secrets).
func (c *Client) ListTokens(ctx context.Context) ([]apiv1.Token, error) {
	return list[apiv1.Token](ctx, c, "/api/v1/admin/tokens", nil)
}

// RevokeToken revokes an API token by id.
func (c *Client) RevokeToken(ctx context.Context, id string) (*apiv1.Token, error) {
	return send[apiv1.Token](ctx, c, http.MethodPost, "/api/v1/admin/tokens/"+esc(id)+"/revoke", nil)
}

// RevokeNode revokes a node's certificates and unused bootstrap tokens.
func (c *Client) RevokeNode(ctx context.Context, node string) (*apiv1.NodeRevocation, error) {
	return send[apiv1.NodeRevocation](ctx, c, http.MethodPost, nodePath(node)+"/revoke", nil)
}

// CreateToken creates an API token. The token string is only in this answer.
func (c *Client) CreateToken(ctx context.Context, req apiv1.TokenCreate) (*apiv1.Token, error) {
	return send[apiv1.Token](ctx, c, http.MethodPost, "/api/v1/admin/tokens", req)
}

// StartSmokeTest boots an image on one free slot of node through the normal provisioning
// path (a validation allocation).
func (c *Client) StartSmokeTest(ctx context.Context, image, node string) (*apiv1.ImageSmokeTest, error) {
	return send[apiv1.ImageSmokeTest](ctx, c, http.MethodPost, imagePath(image)+"/smoke-tests", apiv1.ImageSmokeTestCreate{Node: node})
}

// SmokeTests lists an image's smoke tests, newest first.
func (c *Client) SmokeTests(ctx context.Context, image string) ([]apiv1.ImageSmokeTest, error) {
	return list[apiv1.ImageSmokeTest](ctx, c, imagePath(image)+"/smoke-tests", nil)
}

// ActivateImage activates an image whose current digest passed a smoke test.
func (c *Client) ActivateImage(ctx context.Context, image string) (*apiv1.OSImage, error) {
	return send[apiv1.OSImage](ctx, c, http.MethodPost, imagePath(image)+"/activate", nil)
}

func rolloutPath(sku string) string { return "/api/v1/admin/skus/" + esc(sku) }

// ImageRolloutStatus is a SKU's default image, canary and outcomes.
func (c *Client) ImageRolloutStatus(ctx context.Context, sku string) (*apiv1.ImageRolloutStatus, error) {
	return get[apiv1.ImageRolloutStatus](ctx, c, rolloutPath(sku)+"/image-rollout", nil)
}

// SetDefaultImage points a SKU's default image at a smoke-tested image.
func (c *Client) SetDefaultImage(ctx context.Context, sku, image string) (*apiv1.ImageRolloutStatus, error) {
	return send[apiv1.ImageRolloutStatus](ctx, c, http.MethodPut, rolloutPath(sku)+"/default-image", apiv1.DefaultImageSet{Image: image})
}

// StartRollout starts a canary of an image on a SKU.
func (c *Client) StartRollout(ctx context.Context, sku string, in apiv1.ImageRolloutCreate) (*apiv1.ImageRollout, error) {
	return send[apiv1.ImageRollout](ctx, c, http.MethodPost, rolloutPath(sku)+"/image-rollout", in)
}

// PromoteRollout makes the canary image the SKU's default.
func (c *Client) PromoteRollout(ctx context.Context, sku string) (*apiv1.ImageRollout, error) {
	return send[apiv1.ImageRollout](ctx, c, http.MethodPost, rolloutPath(sku)+"/image-rollout/promote", nil)
}

// RollBackRollout ends the canary or moves the default back from the last promotion.
func (c *Client) RollBackRollout(ctx context.Context, sku string) (*apiv1.ImageRollout, error) {
	return send[apiv1.ImageRollout](ctx, c, http.MethodPost, rolloutPath(sku)+"/image-rollout/rollback", nil)
}

// DemandMix is the demand mix a slice SKU's placement protects in region ("": any) and
// where it came from.
func (c *Client) DemandMix(ctx context.Context, sku, region string) (*apiv1.DemandMix, error) {
	q := url.Values{}
	if region != "" {
		q.Set("region", region)
	}
	return get[apiv1.DemandMix](ctx, c, rolloutPath(sku)+"/demand-mix", q)
}

// PinDemandMix pins a slice SKU's demand mix.
func (c *Client) PinDemandMix(ctx context.Context, sku string, entries []apiv1.DemandMixEntry) (*apiv1.DemandMix, error) {
	return send[apiv1.DemandMix](ctx, c, http.MethodPut, rolloutPath(sku)+"/demand-mix", apiv1.DemandMixPin{Entries: entries})
}

// UnpinDemandMix removes a slice SKU's pinned demand mix.
func (c *Client) UnpinDemandMix(ctx context.Context, sku string) (*apiv1.DemandMix, error) {
	return send[apiv1.DemandMix](ctx, c, http.MethodDelete, rolloutPath(sku)+"/demand-mix", nil)
}
