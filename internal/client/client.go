// Package client is the Go client of the controller's /api/v1 HTTPS API, used by gpuaasctl
// and tests. Every method returns the API's typed *apiv1.Error on a non-2xx answer.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// Options configures a Client.
type Options struct {
	Server     string // https://host:port
	CAFile     string // PEM CA to trust; empty = system roots
	Token      string
	HTTPClient *http.Client
	UserAgent  string
}

// Client talks to one controller.
type Client struct {
	base  *url.URL
	token string
	hc    *http.Client
	ua    string
}

// ErrUnreachable wraps transport failures (connection refused, TLS, timeouts).
var ErrUnreachable = errors.New("cannot reach controller")

const maxResponse = 16 << 20

// New validates options and builds a client. Plain http:// is refused: TLS everywhere.
func New(o Options) (*Client, error) {
	if o.Server == "" {
		return nil, errors.New("no controller address: set --server or GPUAAS_SERVER (https://host:port)")
	}
	u, err := url.Parse(strings.TrimRight(o.Server, "/"))
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("invalid server address %q: want https://host:port", o.Server)
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("server %q must use https:// (the controller serves TLS only)", o.Server)
	}
	hc := o.HTTPClient
	if hc == nil {
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.CAFile != "" {
			if tlsCfg, err = pki.ClientTLSConfig(o.CAFile); err != nil {
				return nil, err
			}
		}
		hc = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment}}
	}
	ua := o.UserAgent
	if ua == "" {
		ua = "gpuaas-client"
	}
	return &Client{base: u, token: o.Token, hc: hc, ua: ua}, nil
}

// Server is the base URL.
func (c *Client) Server() string { return c.base.String() }

func (c *Client) do(ctx context.Context, method, path string, query url.Values, body any, out any, hdr map[string]string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	u := *c.base
	u.Path = c.base.Path + path
	if query != nil {
		u.RawQuery = query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.ua)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return resp, fmt.Errorf("%w: reading response: %v", ErrUnreachable, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var ae apiv1.Error
		if json.Unmarshal(data, &ae) != nil || ae.Code == "" {
			ae = apiv1.Error{Code: codeForStatus(resp.StatusCode), Message: fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(data)))}
		}
		return resp, &ae
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp, fmt.Errorf("decoding %s %s response: %w", method, path, err)
		}
	}
	return resp, nil
}

func codeForStatus(s int) string {
	switch s {
	case 400, 422:
		return apiv1.CodeInvalidRequest
	case 401:
		return apiv1.CodeUnauthorized
	case 403:
		return apiv1.CodeForbidden
	case 404:
		return apiv1.CodeNotFound
	case 409:
		return apiv1.CodeConflict
	case 413:
		return apiv1.CodeTooLarge
	case 502, 503, 504:
		return apiv1.CodeUnavailable
	}
	return apiv1.CodeInternal
}

func esc(s string) string { return url.PathEscape(s) }

// Whoami describes the caller.
func (c *Client) Whoami(ctx context.Context) (*apiv1.Whoami, error) {
	var out apiv1.Whoami
	_, err := c.do(ctx, "GET", "/api/v1/whoami", nil, nil, &out, nil)
	return &out, err
}

// ListSKUs lists active SKUs (all SKUs when admin is true).
func (c *Client) ListSKUs(ctx context.Context, admin bool) ([]apiv1.SKU, error) {
	var out apiv1.List[apiv1.SKU]
	p := "/api/v1/skus"
	if admin {
		p = "/api/v1/admin/skus"
	}
	_, err := c.do(ctx, "GET", p, nil, nil, &out, nil)
	return out.Items, err
}

// CreateSKU adds a SKU.
func (c *Client) CreateSKU(ctx context.Context, s apiv1.SKU) (*apiv1.SKU, error) {
	var out apiv1.SKU
	_, err := c.do(ctx, "POST", "/api/v1/admin/skus", nil, s, &out, nil)
	return &out, err
}

// PatchSKU updates a SKU.
func (c *Client) PatchSKU(ctx context.Context, sku string, p apiv1.SKUPatch) (*apiv1.SKU, error) {
	var out apiv1.SKU
	_, err := c.do(ctx, "PATCH", "/api/v1/admin/skus/"+esc(sku), nil, p, &out, nil)
	return &out, err
}

// Capacity reports raw and topology-safe capacity.
func (c *Client) Capacity(ctx context.Context, sku, region string) ([]apiv1.Capacity, error) {
	q := url.Values{}
	if sku != "" {
		q.Set("sku", sku)
	}
	if region != "" {
		q.Set("region", region)
	}
	var out apiv1.List[apiv1.Capacity]
	_, err := c.do(ctx, "GET", "/api/v1/capacity", q, nil, &out, nil)
	return out.Items, err
}

// ExplainPlacement runs a placement dry run.
func (c *Client) ExplainPlacement(ctx context.Context, req apiv1.PlacementRequest) (*apiv1.PlacementExplain, error) {
	var out apiv1.PlacementExplain
	_, err := c.do(ctx, "POST", "/api/v1/placement/explain", nil, req, &out, nil)
	return &out, err
}

// CreateAllocation creates an allocation; replayed is true for an idempotent replay.
func (c *Client) CreateAllocation(ctx context.Context, req apiv1.AllocationCreate, idempotencyKey string) (a *apiv1.Allocation, replayed bool, err error) {
	var out apiv1.Allocation
	hdr := map[string]string{}
	if idempotencyKey != "" {
		hdr["Idempotency-Key"] = idempotencyKey
	}
	resp, err := c.do(ctx, "POST", "/api/v1/allocations", nil, req, &out, hdr)
	if err != nil {
		return nil, false, err
	}
	return &out, resp.StatusCode == http.StatusOK, nil
}

// ListAllocations lists the caller's allocations.
func (c *Client) ListAllocations(ctx context.Context, status string) ([]apiv1.Allocation, error) {
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	var out apiv1.List[apiv1.Allocation]
	_, err := c.do(ctx, "GET", "/api/v1/allocations", q, nil, &out, nil)
	return out.Items, err
}

// GetAllocation shows one allocation.
func (c *Client) GetAllocation(ctx context.Context, id string) (*apiv1.Allocation, error) {
	var out apiv1.Allocation
	_, err := c.do(ctx, "GET", "/api/v1/allocations/"+esc(id), nil, nil, &out, nil)
	return &out, err
}

// ReleaseAllocation releases one allocation.
func (c *Client) ReleaseAllocation(ctx context.Context, id string) (*apiv1.Allocation, error) {
	var out apiv1.Allocation
	_, err := c.do(ctx, "POST", "/api/v1/allocations/"+esc(id)+"/release", nil, nil, &out, nil)
	return &out, err
}

// CreateNode registers a node.
func (c *Client) CreateNode(ctx context.Context, req apiv1.NodeCreate) (*apiv1.Node, error) {
	var out apiv1.Node
	_, err := c.do(ctx, "POST", "/api/v1/admin/nodes", nil, req, &out, nil)
	return &out, err
}

// ListNodes lists nodes.
func (c *Client) ListNodes(ctx context.Context) ([]apiv1.Node, error) {
	var out apiv1.List[apiv1.Node]
	_, err := c.do(ctx, "GET", "/api/v1/admin/nodes", nil, nil, &out, nil)
	return out.Items, err
}

// GetNode shows a node by id or name.
func (c *Client) GetNode(ctx context.Context, node string) (*apiv1.Node, error) {
	var out apiv1.Node
	_, err := c.do(ctx, "GET", "/api/v1/admin/nodes/"+esc(node), nil, nil, &out, nil)
	return &out, err
}

// SetDraining drains or undrains a node.
func (c *Client) SetDraining(ctx context.Context, node string, drain bool) (*apiv1.Node, error) {
	verb := "undrain"
	if drain {
		verb = "drain"
	}
	var out apiv1.Node
	_, err := c.do(ctx, "POST", "/api/v1/admin/nodes/"+esc(node)+"/"+verb, nil, nil, &out, nil)
	return &out, err
}

// ListSlots lists a node's slots.
func (c *Client) ListSlots(ctx context.Context, node string) ([]apiv1.Slot, error) {
	var out apiv1.List[apiv1.Slot]
	_, err := c.do(ctx, "GET", "/api/v1/admin/nodes/"+esc(node)+"/slots", nil, nil, &out, nil)
	return out.Items, err
}

// ApplySlots applies (or, with DryRun, diffs) a slot map.
func (c *Client) ApplySlots(ctx context.Context, node string, req apiv1.SlotApply) (*apiv1.SlotApplyResult, error) {
	var out apiv1.SlotApplyResult
	_, err := c.do(ctx, "PUT", "/api/v1/admin/nodes/"+esc(node)+"/slots", nil, req, &out, nil)
	return &out, err
}

// SetSlotEnabled enables or disables one slot.
func (c *Client) SetSlotEnabled(ctx context.Context, node string, index int, enabled bool) (*apiv1.Slot, error) {
	verb := "disable"
	if enabled {
		verb = "enable"
	}
	var out apiv1.Slot
	_, err := c.do(ctx, "POST", fmt.Sprintf("/api/v1/admin/nodes/%s/slots/%d/%s", esc(node), index, verb), nil, nil, &out, nil)
	return &out, err
}

// ListImages lists OS images.
func (c *Client) ListImages(ctx context.Context) ([]apiv1.OSImage, error) {
	var out apiv1.List[apiv1.OSImage]
	_, err := c.do(ctx, "GET", "/api/v1/admin/os-images", nil, nil, &out, nil)
	return out.Items, err
}

// CreateImage registers an OS image.
func (c *Client) CreateImage(ctx context.Context, im apiv1.OSImage) (*apiv1.OSImage, error) {
	var out apiv1.OSImage
	_, err := c.do(ctx, "POST", "/api/v1/admin/os-images", nil, im, &out, nil)
	return &out, err
}

// DeleteImage retires an image, or hard-deletes one never referenced.
func (c *Client) DeleteImage(ctx context.Context, id string, hard bool) (*apiv1.OSImage, error) {
	var out apiv1.OSImage
	q := url.Values{}
	if hard {
		q.Set("hard", "true")
	}
	_, err := c.do(ctx, "DELETE", "/api/v1/admin/os-images/"+esc(id), q, nil, &out, nil)
	return &out, err
}

// CreateTenant creates a tenant.
func (c *Client) CreateTenant(ctx context.Context, name string) (*apiv1.Tenant, error) {
	var out apiv1.Tenant
	_, err := c.do(ctx, "POST", "/api/v1/admin/tenants", nil, map[string]string{"name": name}, &out, nil)
	return &out, err
}

// ListTenants lists tenants.
func (c *Client) ListTenants(ctx context.Context) ([]apiv1.Tenant, error) {
	var out apiv1.List[apiv1.Tenant]
	_, err := c.do(ctx, "GET", "/api/v1/admin/tenants", nil, nil, &out, nil)
	return out.Items, err
}

// CreateToken creates an API token.
func (c *Client) CreateToken(ctx context.Context, req apiv1.TokenCreate) (*apiv1.Token, error) {
	var out apiv1.Token
	_, err := c.do(ctx, "POST", "/api/v1/admin/tokens", nil, req, &out, nil)
	return &out, err
}

// Audit lists audit entries, newest first.
func (c *Client) Audit(ctx context.Context, limit int) ([]apiv1.AuditEntry, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", fmt.Sprint(limit))
	}
	var out apiv1.List[apiv1.AuditEntry]
	_, err := c.do(ctx, "GET", "/api/v1/admin/audit", q, nil, &out, nil)
	return out.Items, err
}

// ListTasks lists node tasks (admin), optionally for one node or allocation.
func (c *Client) ListTasks(ctx context.Context, node, allocation string) ([]apiv1.Task, error) {
	q := url.Values{}
	if node != "" {
		q.Set("node", node)
	}
	if allocation != "" {
		q.Set("allocation", allocation)
	}
	var out apiv1.List[apiv1.Task]
	_, err := c.do(ctx, "GET", "/api/v1/tasks", q, nil, &out, nil)
	return out.Items, err
}

// GetTask shows one node task with its phases.
func (c *Client) GetTask(ctx context.Context, id string) (*apiv1.Task, error) {
	var out apiv1.Task
	_, err := c.do(ctx, "GET", "/api/v1/tasks/"+esc(id), nil, nil, &out, nil)
	return &out, err
}

// NewBootstrapToken issues a fresh one-time enrollment token for a node (admin).
func (c *Client) NewBootstrapToken(ctx context.Context, node string) (*apiv1.BootstrapToken, error) {
	var out apiv1.BootstrapToken
	_, err := c.do(ctx, "POST", "/api/v1/admin/nodes/"+esc(node)+"/bootstrap-token", nil, nil, &out, nil)
	return &out, err
}

// DiscoverTopology queues a slice-topology discovery on a node.
func (c *Client) DiscoverTopology(ctx context.Context, node string) (*apiv1.Discovery, error) {
	var out apiv1.Discovery
	_, err := c.do(ctx, "POST", "/api/v1/admin/nodes/"+esc(node)+"/slice-topology/discovery", nil, nil, &out, nil)
	return &out, err
}

// GetTopology returns a node's latest discovery.
func (c *Client) GetTopology(ctx context.Context, node string) (*apiv1.Discovery, error) {
	var out apiv1.Discovery
	_, err := c.do(ctx, "GET", "/api/v1/admin/nodes/"+esc(node)+"/slice-topology/discovery", nil, nil, &out, nil)
	return &out, err
}

// ApproveSlots promotes discovered candidates into slots.
func (c *Client) ApproveSlots(ctx context.Context, node string, req apiv1.SlotApprove) (*apiv1.SlotApplyResult, error) {
	var out apiv1.SlotApplyResult
	_, err := c.do(ctx, "POST", "/api/v1/admin/nodes/"+esc(node)+"/slots/approve", nil, req, &out, nil)
	return &out, err
}

// StorageTransition queues a storage transition on a node (dry run unless apply).
func (c *Client) StorageTransition(ctx context.Context, node string, req apiv1.StorageTransitionRequest) (string, error) {
	var out map[string]string
	_, err := c.do(ctx, "POST", "/api/v1/admin/nodes/"+esc(node)+"/storage-transition", nil, req, &out, nil)
	return out["task_id"], err
}

// WipeSlot queues a repair wipe + verify of a cleanup_blocked slot.
func (c *Client) WipeSlot(ctx context.Context, node string, index int, apply bool) (string, error) {
	var out map[string]string
	_, err := c.do(ctx, "POST", fmt.Sprintf("/api/v1/admin/nodes/%s/slots/%d/wipe", esc(node), index), nil, map[string]bool{"apply": apply}, &out, nil)
	return out["task_id"], err
}
