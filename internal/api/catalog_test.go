package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// catalogAPI is the real API (no allocation service: the catalog handlers do not use it) on a
// fresh database, with an admin token and a tenant token.
type catalogAPI struct {
	t      *testing.T
	url    string // database
	srv    *httptest.Server
	st     *store.Store
	admin  string
	tenant string
}

func newCatalogAPI(t *testing.T, imageKeys ...imagesig.Key) *catalogAPI {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	c := &catalogAPI{t: t, url: pgtest.NewDatabase(t), admin: "gpa_catalog_admin_0123456789", tenant: "gpa_catalog_tenant_0123456789"}
	st, err := store.Open(ctx, c.url, store.Options{AllowUntestedImages: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	c.st = st
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		if _, err := tx.CreateToken(ctx, "catalog-admin", pki.HashToken(c.admin), "admin", "", nil); err != nil {
			return err
		}
		ten, err := tx.CreateTenant(ctx, "acme")
		if err != nil {
			return err
		}
		_, err = tx.CreateToken(ctx, "acme-ci", pki.HashToken(c.tenant), "tenant", ten.ID, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.srv = httptest.NewServer(api.New(api.Options{Store: st, Version: "test", ImageKeys: imageKeys}).Handler())
	t.Cleanup(c.srv.Close)
	return c
}

// call sends body (nil, a raw string, or a value to marshal) and returns status and body.
func (c *catalogAPI) call(method, path, token string, body any) (int, []byte) {
	c.t.Helper()
	var r io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(v)
	default:
		buf, err := json.Marshal(v)
		if err != nil {
			c.t.Fatal(err)
		}
		r = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, c.srv.URL+path, r)
	if err != nil {
		c.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if r != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.srv.Client().Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// ok calls and requires status want, decoding the body into into (if not nil).
func (c *catalogAPI) ok(method, path string, body any, want int, into any) {
	c.t.Helper()
	code, out := c.call(method, path, c.admin, body)
	if code != want {
		c.t.Fatalf("%s %s = %d, want %d: %s", method, path, code, want, out)
	}
	if into != nil {
		if err := json.Unmarshal(out, into); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, out)
		}
	}
}

// fails calls as admin and requires an API error with status want whose message contains msg.
func (c *catalogAPI) fails(method, path string, body any, want int, msg string) apiv1.Error {
	c.t.Helper()
	code, out := c.call(method, path, c.admin, body)
	var e apiv1.Error
	if err := json.Unmarshal(out, &e); err != nil || e.Code == "" {
		c.t.Fatalf("%s %s: not an API error (%d): %s", method, path, code, out)
	}
	if code != want || !strings.Contains(e.Message, msg) {
		c.t.Fatalf("%s %s = %d %q, want %d containing %q", method, path, code, e.Message, want, msg)
	}
	return e
}

func (c *catalogAPI) audit(action string) []apiv1.AuditEntry {
	c.t.Helper()
	out, err := c.st.ListAudit(context.Background(), store.AuditFilter{Action: action})
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

func apiImage(slug string, n int) apiv1.OSImage {
	return apiv1.OSImage{Slug: slug, DisplayName: "Image " + slug, Version: "1", Target: "vm_slice", Family: "debian",
		Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://images.example/" + slug + ".qcow2",
		DigestSHA256: fmt.Sprintf("%064x", n), CloudInitSupported: true, DefaultUsername: "debian", DriverStrategy: "none", Active: true}
}

func TestCatalogAPICreateImageRequiresDigest(t *testing.T) {
	c := newCatalogAPI(t)
	im := apiImage("no-digest", 1)
	im.DigestSHA256 = ""
	e := c.fails("POST", "/api/v1/admin/os-images", im, 400, "")
	if e.Code != apiv1.CodeInvalidRequest || e.Message != "digest_sha256 is required: images are immutable artifacts identified by digest" {
		t.Fatalf("missing digest = %+v", e)
	}
	// Inactive placeholders are refused too: the API never creates one.
	im.Active = false
	c.fails("POST", "/api/v1/admin/os-images", im, 400, "digest_sha256 is required")
	for _, d := range []string{"abc", strings.Repeat("A", 64), strings.Repeat("g", 64), strings.Repeat("a", 65), "sha256:" + strings.Repeat("a", 64)} {
		im.DigestSHA256 = d
		if e := c.fails("POST", "/api/v1/admin/os-images", im, 400, "64 lowercase hex"); e.Code != apiv1.CodeInvalidRequest {
			t.Fatalf("digest %q: %+v", d, e)
		}
	}
	if _, err := c.st.GetImage(context.Background(), "no-digest"); err == nil {
		t.Fatal("a refused image was stored")
	}
	if n := len(c.audit("os_image.create")); n != 0 {
		t.Fatalf("%d audit rows for refused creates", n)
	}
}

func TestCatalogAPIAdminRoutesRefuseTenants(t *testing.T) {
	c := newCatalogAPI(t)
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/api/v1/admin/skus", nil},
		{"PATCH", "/api/v1/admin/skus/h200-sxm-slice", apiv1.SKUPatch{GPUHourlyPriceMinor: ptrTo(int64(1))}},
		{"GET", "/api/v1/admin/os-images", nil},
		{"POST", "/api/v1/admin/os-images", apiImage("tenant-image", 1)},
		{"GET", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", nil},
		{"PATCH", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{DisplayName: ptrTo("x")}},
		{"DELETE", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", nil},
		{"DELETE", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice?hard=true", nil},
	} {
		code, body := c.call(r.method, r.path, c.tenant, r.body)
		var e apiv1.Error
		_ = json.Unmarshal(body, &e)
		if code != 403 || e.Code != apiv1.CodeForbidden {
			t.Errorf("tenant %s %s = %d %s", r.method, r.path, code, body)
		}
		if code, _ := c.call(r.method, r.path, "", r.body); code != 401 {
			t.Errorf("anonymous %s %s = %d", r.method, r.path, code)
		}
	}
	// Nothing changed.
	sku, _ := c.st.GetSKU(context.Background(), "h200-sxm-slice")
	img, _ := c.st.GetImage(context.Background(), "ubuntu-24.04-gpuaas-slice")
	if sku.GPUHourlyPriceMinor != 450 || img.DisplayName == "x" || img.RetiredAt != nil {
		t.Fatalf("tenant requests changed the catalog: %+v %+v", sku, img)
	}
	// Tenants do see the active SKU list.
	code, body := c.call("GET", "/api/v1/skus", c.tenant, nil)
	var l apiv1.List[apiv1.SKU]
	if code != 200 || json.Unmarshal(body, &l) != nil || len(l.Items) != 3 {
		t.Fatalf("tenant GET /api/v1/skus = %d %s", code, body)
	}
}

func TestCatalogAPISKUs(t *testing.T) {
	c := newCatalogAPI(t)
	var out apiv1.SKU
	c.ok("PATCH", "/api/v1/admin/skus/h200-sxm-slice", apiv1.SKUPatch{GPUHourlyPriceMinor: ptrTo(int64(500)),
		AllowedGPUCounts: []int{1, 2, 4}}, 200, &out)
	if out.GPUHourlyPriceMinor != 500 || !reflect.DeepEqual(out.AllowedGPUCounts, []int{1, 2, 4}) || out.DisplayName != "NVIDIA H200 GPU VM" {
		t.Fatalf("patched = %+v", out)
	}
	entries := c.audit("sku.patch")
	if len(entries) != 1 || entries[0].TargetKind != "sku" || entries[0].TargetID != "h200-sxm-slice" || entries[0].ActorRole != "admin" {
		t.Fatalf("audit = %+v", entries)
	}
	var details struct {
		Changes map[string]struct{ From, To any } `json:"changes"`
	}
	if err := json.Unmarshal(entries[0].Details, &details); err != nil {
		t.Fatal(err)
	}
	if p := details.Changes["gpu_hourly_price_minor"]; p.From != float64(450) || p.To != float64(500) || len(details.Changes) != 2 {
		t.Fatalf("audit details = %s", entries[0].Details)
	}

	// Switched off: gone from the public list (for admins too), still in the admin list.
	c.ok("PATCH", "/api/v1/admin/skus/amd-mi300x-roce-slice", map[string]any{"active": false}, 200, &out)
	var pub, all apiv1.List[apiv1.SKU]
	c.ok("GET", "/api/v1/skus", nil, 200, &pub)
	c.ok("GET", "/api/v1/admin/skus", nil, 200, &all)
	if len(pub.Items) != 2 || len(all.Items) != 3 {
		t.Fatalf("public %d, admin %d SKUs", len(pub.Items), len(all.Items))
	}
	for _, s := range pub.Items {
		if s.SKU == "amd-mi300x-roce-slice" {
			t.Fatal("inactive SKU listed publicly")
		}
	}

	// A valid new resource profile.
	rp := json.RawMessage(`{"default_slice_vm_profile":"p1","slice_vm_profiles":{"p1":{"gpu_count":1,"vcpu_count":8,"memory_mib":1024}},
		"topology_policy":{"1":"any","4":"numa_required"}}`)
	c.ok("PATCH", "/api/v1/admin/skus/h200-sxm-slice", apiv1.SKUPatch{ResourceProfile: &rp}, 200, &out)
	c.fails("PATCH", "/api/v1/admin/skus/no-such-sku", apiv1.SKUPatch{Active: ptrTo(true)}, 404, "no-such-sku")
	// The validation policy alone is a patch (docs/health.md); burn-in is one of them.
	c.ok("PATCH", "/api/v1/admin/skus/h200-sxm-slice", map[string]any{"validation_policy": "burn-in"}, 200, &out)
	if out.ValidationPolicy != "burn-in" {
		t.Fatalf("validation policy = %q", out.ValidationPolicy)
	}

	path := "/api/v1/admin/skus/h200-sxm-slice"
	for _, tc := range []struct {
		name string
		body any
		msg  string
	}{
		{"empty patch", `{}`, "empty patch"},
		{"unknown field", `{"gpu_hourly_price":1}`, "unknown field"},
		{"empty counts", `{"allowed_gpu_counts":[]}`, "must not be empty"},
		{"zero count", apiv1.SKUPatch{AllowedGPUCounts: []int{0, 1}}, "strictly increasing"},
		{"decreasing", apiv1.SKUPatch{AllowedGPUCounts: []int{4, 2}}, "strictly increasing"},
		{"duplicate", apiv1.SKUPatch{AllowedGPUCounts: []int{1, 1}}, "strictly increasing"},
		{"over total", apiv1.SKUPatch{AllowedGPUCounts: []int{1, 16}}, "1..8"},
		{"negative price", apiv1.SKUPatch{GPUHourlyPriceMinor: ptrTo(int64(-1))}, ">= 0"},
		{"empty name", apiv1.SKUPatch{DisplayName: ptrTo(" ")}, "display_name"},
		{"profile array", `{"resource_profile":[1]}`, "must be a JSON object"},
		{"profile null", `{"resource_profile":null}`, "empty patch"},
		{"profiles not object", `{"resource_profile":{"default_slice_vm_profile":"p","slice_vm_profiles":[]}}`, "slice_vm_profiles must be an object"},
		{"no vcpu", `{"resource_profile":{"default_slice_vm_profile":"p","slice_vm_profiles":{"p":{"gpu_count":1,"memory_mib":1}}}}`, "slice_vm_profiles.p needs positive"},
		{"negative memory", `{"resource_profile":{"default_slice_vm_profile":"p","slice_vm_profiles":{"p":{"gpu_count":1,"vcpu_count":1,"memory_mib":-1}}}}`, "slice_vm_profiles.p needs positive"},
		{"too many gpus", `{"resource_profile":{"default_slice_vm_profile":"p","slice_vm_profiles":{"p":{"gpu_count":9,"vcpu_count":1,"memory_mib":1}}}}`, "8 GPUs"},
		{"default missing", `{"resource_profile":{"default_slice_vm_profile":"q","slice_vm_profiles":{"p":{"gpu_count":1,"vcpu_count":1,"memory_mib":1}}}}`, `"q" is not in slice_vm_profiles`},
		{"slice without default", `{"resource_profile":{"slice_vm_profiles":{"p":{"gpu_count":1,"vcpu_count":1,"memory_mib":1}}}}`, "needs resource_profile.default_slice_vm_profile"},
		{"unknown validation", `{"validation_policy":"soak"}`, "must be none, quick or burn-in"},
		{"bad policy", `{"resource_profile":{"default_slice_vm_profile":"p","slice_vm_profiles":{"p":{"gpu_count":1,"vcpu_count":1,"memory_mib":1}},"topology_policy":{"1":"pack"}}}`, "topology_policy[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if e := c.fails("PATCH", path, tc.body, 400, tc.msg); e.Code != apiv1.CodeInvalidRequest {
				t.Fatalf("%+v", e)
			}
		})
	}
	c.fails("PATCH", "/api/v1/admin/skus/h200-sxm-baremetal-8g", apiv1.SKUPatch{AllowedGPUCounts: []int{4, 8}}, 400, "whole node")
	// None of the refused patches was applied or audited.
	got, _ := c.st.GetSKU(context.Background(), "h200-sxm-slice")
	if got.GPUHourlyPriceMinor != 500 || !reflect.DeepEqual(got.AllowedGPUCounts, []int{1, 2, 4}) || !strings.Contains(string(got.ResourceProfile), `"p1"`) {
		t.Fatalf("after refused patches = %+v", got)
	}
	if n := len(c.audit("sku.patch")); n != 4 {
		t.Fatalf("%d sku.patch audit rows, want 4", n)
	}
}

func TestCatalogAPIImageLifecycle(t *testing.T) {
	c := newCatalogAPI(t)
	ctx := context.Background()
	req := apiImage("debian-12-slice", 1)
	req.AcceleratorVendor, req.NetworkFabric = "nvidia", "infiniband"
	req.CompatibilityMetadata = json.RawMessage(`{"compatible_skus":["h200-sxm-slice"]}`)
	var im apiv1.OSImage
	c.ok("POST", "/api/v1/admin/os-images", req, 201, &im)
	if im.ID == "" || im.Slug != req.Slug || im.DigestSHA256 != req.DigestSHA256 || !im.Active {
		t.Fatalf("created = %+v", im)
	}
	created := c.audit("os_image.create")
	if len(created) != 1 || created[0].TargetKind != "os_image" || created[0].TargetID != im.ID ||
		!strings.Contains(string(created[0].Details), `"slug": "debian-12-slice"`) ||
		!strings.Contains(string(created[0].Details), im.DigestSHA256) || created[0].RequestID == "" {
		t.Fatalf("create audit = %+v %s", created, created[0].Details)
	}
	c.fails("POST", "/api/v1/admin/os-images", req, 409, "")

	// Get by slug and by id.
	var bySlug, byID apiv1.OSImage
	c.ok("GET", "/api/v1/admin/os-images/debian-12-slice", nil, 200, &bySlug)
	c.ok("GET", "/api/v1/admin/os-images/"+im.ID, nil, 200, &byID)
	if bySlug.ID != im.ID || byID.Slug != im.Slug {
		t.Fatalf("get = %+v / %+v", bySlug, byID)
	}
	c.fails("GET", "/api/v1/admin/os-images/nope", nil, 404, "nope")
	c.fails("GET", "/api/v1/admin/os-images/00000000-0000-0000-0000-000000000000", nil, 404, "not found")

	// List with filters.
	for q, want := range map[string]int{
		"": 3, "?target=vm_slice": 3, "?target=baremetal": 0, "?active=true": 1, "?active=false": 2,
		"?family=ubuntu": 2, "?family=debian&active=true": 1, "?accelerator_vendor=nvidia": 2, "?network_fabric=any": 1,
	} {
		var l apiv1.List[apiv1.OSImage]
		c.ok("GET", "/api/v1/admin/os-images"+q, nil, 200, &l)
		if len(l.Items) != want {
			t.Errorf("list%s = %d images, want %d", q, len(l.Items), want)
		}
	}
	c.fails("GET", "/api/v1/admin/os-images?target=vm", nil, 400, `target "vm" is not one of baremetal, vm_slice`)
	c.fails("GET", "/api/v1/admin/os-images?active=maybe", nil, 400, "active must be true or false")
	c.fails("GET", "/api/v1/admin/os-images?family=arch", nil, 400, "family")

	// Patch, audited with before and after.
	var p apiv1.OSImage
	c.ok("PATCH", "/api/v1/admin/os-images/debian-12-slice", apiv1.OSImagePatch{DisplayName: ptrTo("Debian 12"),
		SizeBytes: ptrTo(int64(1 << 30)), IsDefault: ptrTo(true)}, 200, &p)
	if p.DisplayName != "Debian 12" || *p.SizeBytes != 1<<30 || !p.IsDefault || p.DigestSHA256 != im.DigestSHA256 {
		t.Fatalf("patched = %+v", p)
	}
	patched := c.audit("os_image.patch")
	if len(patched) != 1 || patched[0].TargetID != im.ID {
		t.Fatalf("patch audit = %+v", patched)
	}
	var pd struct {
		Slug    string                            `json:"slug"`
		Changes map[string]struct{ From, To any } `json:"changes"`
	}
	if err := json.Unmarshal(patched[0].Details, &pd); err != nil {
		t.Fatal(err)
	}
	if dn := pd.Changes["display_name"]; pd.Slug != "debian-12-slice" || len(pd.Changes) != 3 ||
		dn.From != "Image debian-12-slice" || dn.To != "Debian 12" || pd.Changes["is_default"].To != true {
		t.Fatalf("patch audit details = %s", patched[0].Details)
	}

	// A placeholder cannot be activated without a digest; with one, it can.
	c.fails("PATCH", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{Active: ptrTo(true)}, 400,
		"digest_sha256 is required: images are immutable artifacts identified by digest")
	c.fails("PATCH", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{IsDefault: ptrTo(true)}, 400,
		"is_default requires an active image")
	c.fails("PATCH", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{DigestSHA256: ptrTo("XYZ")}, 400,
		"64 lowercase hex")
	c.fails("PATCH", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", `{}`, 400, "empty patch")
	c.fails("PATCH", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", `{"slug":"renamed"}`, 400, "unknown field")
	c.fails("PATCH", "/api/v1/admin/os-images/nope", apiv1.OSImagePatch{DisplayName: ptrTo("x")}, 404, "nope")
	// With a digest it still needs a passed smoke test of that digest (images test, then
	// activate): no PATCH makes an untested image active.
	c.fails("PATCH", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{
		DigestSHA256: ptrTo(strings.Repeat("ab", 32)), Active: ptrTo(true), IsDefault: ptrTo(true)}, 409, "no passed smoke test")
	c.fails("POST", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice/activate", nil, 409, "no passed smoke test")
	if got, _ := c.st.GetImage(ctx, "ubuntu-24.04-gpuaas-slice"); got.Active || got.DigestSHA256 != "" {
		t.Fatalf("refused activation changed the image: %+v", got)
	}
	// The legacy default marker moves to an image activated below the API (the store, as a
	// fixture for a tested image) and stays unique.
	if err := c.st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.PatchImage(ctx, "ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{DigestSHA256: ptrTo(strings.Repeat("ab", 32)), Active: ptrTo(true)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var ph apiv1.OSImage
	c.ok("PATCH", "/api/v1/admin/os-images/ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{IsDefault: ptrTo(true)}, 200, &ph)
	if !ph.Active || !ph.IsDefault || ph.DigestSHA256 != strings.Repeat("ab", 32) {
		t.Fatalf("activated placeholder = %+v", ph)
	}
	if again, _ := c.st.GetImage(ctx, im.ID); again.IsDefault {
		t.Fatal("two default vm_slice images")
	}

	// Retire (idempotent), then hard delete.
	var r apiv1.OSImage
	c.ok("DELETE", "/api/v1/admin/os-images/debian-12-slice", nil, 200, &r)
	if r.Active || r.RetiredAt == nil || r.IsDefault {
		t.Fatalf("retired = %+v", r)
	}
	c.ok("DELETE", "/api/v1/admin/os-images/"+im.ID+"?hard=false", nil, 200, &r)
	if retires := c.audit("os_image.retire"); len(retires) != 2 || !strings.Contains(string(retires[0].Details), `"already_retired": true`) {
		t.Fatalf("retire audit = %+v", retires)
	}
	c.fails("DELETE", "/api/v1/admin/os-images/"+im.ID+"?hard=maybe", nil, 400, "hard must be true or false")
	c.ok("DELETE", "/api/v1/admin/os-images/"+im.ID+"?hard=true", nil, 200, &r)
	if r.ID != im.ID {
		t.Fatalf("hard delete returned %+v", r)
	}
	c.fails("GET", "/api/v1/admin/os-images/"+im.ID, nil, 404, "not found")
	c.fails("DELETE", "/api/v1/admin/os-images/"+im.ID, nil, 404, "not found")
	if deletes := c.audit("os_image.delete"); len(deletes) != 1 || deletes[0].TargetID != im.ID {
		t.Fatalf("delete audit = %+v", deletes)
	}
}

func TestCatalogAPIHardDeleteOfReferencedImageConflicts(t *testing.T) {
	c := newCatalogAPI(t)
	ctx := context.Background()
	var im apiv1.OSImage
	c.ok("POST", "/api/v1/admin/os-images", apiImage("in-use", 2), 201, &im)
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `WITH n AS (INSERT INTO nodes (name, region) VALUES ('n1', 'lab') RETURNING id)
		INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, os_image_id, price_snapshot)
		SELECT (SELECT id FROM tenants WHERE name = 'acme'), 'h200-sxm-slice', 'gpu_slice', 1, 'lab', n.id, $1, '{}' FROM n`,
		im.ID); err != nil {
		t.Fatal(err)
	}
	e := c.fails("DELETE", "/api/v1/admin/os-images/in-use?hard=true", nil, 409, "referenced by 1 allocation; retire it instead")
	if e.Code != apiv1.CodeConflict {
		t.Fatalf("conflict = %+v", e)
	}
	if n := len(c.audit("os_image.delete")); n != 0 {
		t.Fatalf("%d audit rows for a refused delete", n)
	}
	var r apiv1.OSImage
	c.ok("DELETE", "/api/v1/admin/os-images/in-use", nil, 200, &r)
	if r.Active || r.RetiredAt == nil {
		t.Fatalf("retired = %+v", r)
	}
}

func TestCatalogAPIImageValidation(t *testing.T) {
	c := newCatalogAPI(t)
	mod := func(f func(*apiv1.OSImage)) apiv1.OSImage {
		im := apiImage("valid-image", 9)
		f(&im)
		return im
	}
	for _, tc := range []struct {
		name string
		body any
		msg  string
	}{
		{"unknown field", `{"slug":"x","digest":"` + strings.Repeat("a", 64) + `"}`, "unknown field"},
		{"two objects", `{}{}`, "single JSON object"},
		{"bad slug", mod(func(i *apiv1.OSImage) { i.Slug = "Bad Slug" }), "slug must match"},
		{"uuid slug", mod(func(i *apiv1.OSImage) { i.Slug = "0b5d6a8e-0000-4000-8000-000000000001" }), "must not look like a UUID"},
		{"no display name", mod(func(i *apiv1.OSImage) { i.DisplayName = "" }), "display_name"},
		{"no version", mod(func(i *apiv1.OSImage) { i.Version = "" }), "version"},
		{"bad target", mod(func(i *apiv1.OSImage) { i.Target = "vm" }), `target "vm" is not one of baremetal, vm_slice`},
		{"no target", mod(func(i *apiv1.OSImage) { i.Target = "" }), "target is required"},
		{"bad family", mod(func(i *apiv1.OSImage) { i.Family = "arch" }), "family"},
		{"bad arch", mod(func(i *apiv1.OSImage) { i.Architecture = "x86_64" }), "architecture"},
		{"bad format", mod(func(i *apiv1.OSImage) { i.ImageFormat = "vmdk" }), "image_format"},
		{"bad source type", mod(func(i *apiv1.OSImage) { i.SourceType = "ftp" }), "source_type"},
		{"bad driver strategy", mod(func(i *apiv1.OSImage) { i.DriverStrategy = "dkms" }), "driver_strategy"},
		{"bad vendor", mod(func(i *apiv1.OSImage) { i.AcceleratorVendor = "intel" }), "accelerator_vendor"},
		{"bad fabric", mod(func(i *apiv1.OSImage) { i.NetworkFabric = "ib" }), "network_fabric"},
		{"maas slice", mod(func(i *apiv1.OSImage) { i.ImageFormat = "maas" }), "qcow2 or raw"},
		{"maas source slice", mod(func(i *apiv1.OSImage) { i.SourceType = "maas" }), "cannot come from MAAS"},
		{"no source ref", mod(func(i *apiv1.OSImage) { i.SourceRef = " " }), "source_ref is required"},
		{"no username", mod(func(i *apiv1.OSImage) { i.DefaultUsername = "" }), "default_username is required"},
		{"bad username", mod(func(i *apiv1.OSImage) { i.DefaultUsername = "root; rm -rf /" }), "default_username must match"},
		{"zero size", mod(func(i *apiv1.OSImage) { i.SizeBytes = ptrTo(int64(0)) }), "size_bytes must be positive"},
		{"compat array", mod(func(i *apiv1.OSImage) { i.CompatibilityMetadata = json.RawMessage(`[1]`) }), "compatibility_metadata must be a JSON object"},
		{"compat string", mod(func(i *apiv1.OSImage) { i.CompatibilityMetadata = json.RawMessage(`"x"`) }), "compatibility_metadata must be a JSON object"},
		{"compat skus", mod(func(i *apiv1.OSImage) {
			i.CompatibilityMetadata = json.RawMessage(`{"compatible_skus":"h200-sxm-slice"}`)
		}), "compatible_skus must be a list"},
		{"default inactive", mod(func(i *apiv1.OSImage) { i.IsDefault, i.Active = true, false }), "is_default requires an active image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if e := c.fails("POST", "/api/v1/admin/os-images", tc.body, 400, tc.msg); e.Code != apiv1.CodeInvalidRequest {
				t.Fatalf("%+v", e)
			}
		})
	}
	// The baseline is valid, and a baremetal MAAS image is fine.
	c.ok("POST", "/api/v1/admin/os-images", apiImage("valid-image", 9), 201, nil)
	c.ok("POST", "/api/v1/admin/os-images", mod(func(i *apiv1.OSImage) {
		i.Slug, i.Target, i.ImageFormat, i.SourceType, i.SourceRef, i.Family = "noble-maas", "baremetal", "maas", "maas", "ubuntu/noble", "ubuntu"
		i.CompatibilityMetadata = json.RawMessage(`{"notes":"maas deploy image"}`)
	}), 201, nil)
	if n := len(c.audit("os_image.create")); n != 2 {
		t.Fatalf("%d os_image.create audit rows, want 2", n)
	}
}

func ptrTo[T any](v T) *T { return &v }
