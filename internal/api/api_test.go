package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run()) // fuzzing runs only the database-free fuzz targets (fuzz_test.go)
	}
	os.Exit(pgtest.Main(m, store.MigrateForTest))
}

type apiBundle struct {
	t      *testing.T
	srv    *httptest.Server
	st     *store.Store
	admin  string
	tenant string
	other  string
	tenID  string
	dsn    string // the test's database, for tests that compare rows directly
	svc    *alloc.Service
}

// setup starts the real API over TLS on a fresh database with an admin token.
func setup(t *testing.T) *apiBundle {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	st, err := store.Open(ctx, dsn, store.Options{AllowUntestedImages: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := &apiBundle{t: t, st: st, admin: "gpa_test_admin_token_0123456789", dsn: dsn}
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.CreateToken(ctx, "test-admin", pki.HashToken(b.admin), "admin", "", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	b.svc = alloc.New(st, alloc.Config{})
	b.srv = httptest.NewTLSServer(api.New(api.Options{Store: st, Alloc: b.svc, Version: "test"}).Handler())
	t.Cleanup(b.srv.Close)
	return b
}

func (b *apiBundle) do(method, path, token string, body any, hdr ...string) (int, []byte) {
	b.t.Helper()
	var r io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(v)
	default:
		buf, _ := json.Marshal(v)
		r = bytes.NewReader(buf)
	}
	req, _ := http.NewRequest(method, b.srv.URL+path, r)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (b *apiBundle) must(method, path, token string, body any, want int, into any) {
	b.t.Helper()
	code, out := b.do(method, path, token, body)
	if code != want {
		b.t.Fatalf("%s %s = %d, want %d: %s", method, path, code, want, out)
	}
	if into != nil {
		if err := json.Unmarshal(out, into); err != nil {
			b.t.Fatalf("%s %s: %v: %s", method, path, err, out)
		}
	}
}

func apiError(t *testing.T, body []byte) apiv1.Error {
	t.Helper()
	var e apiv1.Error
	if err := json.Unmarshal(body, &e); err != nil || e.Code == "" {
		t.Fatalf("not an API error: %s", body)
	}
	return e
}

// world makes two tenants with tokens, a viable image and one H200 node with 8 slots.
func (b *apiBundle) world() {
	b.t.Helper()
	var t1, t2 apiv1.Tenant
	b.must("POST", "/api/v1/admin/tenants", b.admin, map[string]string{"name": "acme"}, 201, &t1)
	b.must("POST", "/api/v1/admin/tenants", b.admin, map[string]string{"name": "globex"}, 201, &t2)
	var tok apiv1.Token
	b.must("POST", "/api/v1/admin/tokens", b.admin, apiv1.TokenCreate{Name: "acme-ci", Role: "tenant", TenantID: t1.ID}, 201, &tok)
	b.tenant, b.tenID = tok.Token, t1.ID
	b.must("POST", "/api/v1/admin/tokens", b.admin, apiv1.TokenCreate{Name: "globex-ci", Role: "tenant", TenantID: t2.ID}, 201, &tok)
	b.other = tok.Token
	b.must("POST", "/api/v1/admin/os-images", b.admin, apiv1.OSImage{Slug: "img", DisplayName: "img", Version: "1",
		Target: "vm_slice", Family: "debian", Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http",
		SourceRef: "https://images.example/img.qcow2", DigestSHA256: strings.Repeat("0f", 32), DefaultUsername: "debian",
		DriverStrategy: "none", Active: true}, 201, nil)
	b.must("POST", "/api/v1/admin/nodes", b.admin, apiv1.NodeCreate{Name: "n1", Region: "lab", SKU: "h200-sxm-baremetal-8g",
		SliceSKU: "h200-sxm-slice", ProfileTags: []string{"gpuaas-profile-slice-vm"}}, 201, nil)
	b.must("PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: fixtures.H200SlotMap(1)}, 200, nil)
}

func TestHealthReadyOpenAPIWithoutToken(t *testing.T) {
	b := setup(t)
	for _, p := range []string{"/healthz", "/readyz", "/api/v1/openapi.json", "/metrics"} {
		if code, body := b.do("GET", p, "", nil); code != 200 {
			t.Fatalf("%s = %d %s", p, code, body)
		}
	}
	_, body := b.do("GET", "/api/v1/openapi.json", "", nil)
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.OpenAPI != "3.1.0" {
		t.Fatalf("openapi: %v %s", err, doc.OpenAPI)
	}
	for _, p := range []string{"/api/v1/allocations", "/api/v1/admin/nodes/{id}/slots", "/api/v1/placement/explain",
		"/api/v1/quotas", "/api/v1/reservations", "/api/v1/reservations/{id}/cancel", "/api/v1/admin/tenants/{id}/quotas"} {
		if doc.Paths[p] == nil {
			t.Fatalf("openapi lacks %s", p)
		}
	}
	if _, ok := doc.Paths["/api/v1/allocations"]["post"]; !ok {
		t.Fatal("openapi lacks POST /api/v1/allocations")
	}
}

func TestAuthRequiredAndRoles(t *testing.T) {
	b := setup(t)
	b.world()
	code, body := b.do("GET", "/api/v1/allocations", "", nil)
	if code != 401 || apiError(t, body).Code != "unauthorized" {
		t.Fatalf("no token: %d %s", code, body)
	}
	code, body = b.do("GET", "/api/v1/allocations", "gpa_wrong", nil)
	if code != 401 {
		t.Fatalf("bad token: %d %s", code, body)
	}
	code, body = b.do("GET", "/api/v1/admin/nodes", b.tenant, nil)
	if code != 403 || apiError(t, body).Code != "forbidden" {
		t.Fatalf("tenant on admin route: %d %s", code, body)
	}
	var who apiv1.Whoami
	b.must("GET", "/api/v1/whoami", b.tenant, nil, 200, &who)
	if who.Role != "tenant" || who.TenantID != b.tenID {
		t.Fatalf("whoami = %+v", who)
	}
}

func TestAllocationLifecycleOverHTTP(t *testing.T) {
	b := setup(t)
	b.world()
	var a apiv1.Allocation
	code, body := b.do("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2}, "Idempotency-Key", "k1")
	if code != 201 {
		t.Fatalf("create = %d %s", code, body)
	}
	_ = json.Unmarshal(body, &a)
	if a.Status != "requested" || a.GPUs != 2 || a.NodeID != "" {
		t.Fatalf("tenant view = %+v", a)
	}
	code, body = b.do("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2}, "Idempotency-Key", "k1")
	var replay apiv1.Allocation
	_ = json.Unmarshal(body, &replay)
	if code != 200 || replay.ID != a.ID {
		t.Fatalf("replay = %d %s", code, body)
	}
	var adminView apiv1.Allocation
	b.must("GET", "/api/v1/allocations/"+a.ID, b.admin, nil, 200, &adminView)
	if adminView.NodeName != "n1" || len(adminView.Claims) != 2 || adminView.Claims[0].PCIAddress == "" {
		t.Fatalf("admin view = %+v", adminView)
	}
	if code, _ := b.do("GET", "/api/v1/allocations/"+a.ID, b.other, nil); code != 404 {
		t.Fatalf("other tenant sees allocation: %d", code)
	}
	if code, _ := b.do("POST", "/api/v1/allocations/"+a.ID+"/release", b.other, nil); code != 404 {
		t.Fatalf("other tenant releases allocation: %d", code)
	}
	var list apiv1.List[apiv1.Allocation]
	b.must("GET", "/api/v1/allocations", b.other, nil, 200, &list)
	if len(list.Items) != 0 {
		t.Fatalf("other tenant lists %d", len(list.Items))
	}
	var rel apiv1.Allocation
	b.must("POST", "/api/v1/allocations/"+a.ID+"/release", b.tenant, nil, 200, &rel)
	if rel.Status != "released" {
		t.Fatalf("released = %s", rel.Status)
	}
	var audit apiv1.List[apiv1.AuditEntry]
	b.must("GET", "/api/v1/admin/audit?limit=50", b.admin, nil, 200, &audit)
	actions := map[string]bool{}
	for _, e := range audit.Items {
		actions[e.Action] = true
	}
	for _, want := range []string{"tenant.create", "token.create", "node.create", "node.slots.apply", "allocation.create", "allocation.release", "os_image.create"} {
		if !actions[want] {
			t.Fatalf("audit lacks %s: %v", want, actions)
		}
	}
}

func TestSKUUnavailableErrorShape(t *testing.T) {
	b := setup(t)
	b.world()
	code, body := b.do("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 3})
	e := apiError(t, body)
	if code != 409 || e.Code != "sku_unavailable" || e.Details["reason"] != "count_not_allowed" {
		t.Fatalf("3 GPUs = %d %s", code, body)
	}
	// A tenant's explain says whether and how its request fits, with no host in it; an admin's
	// names the ranked nodes.
	var ex apiv1.PlacementExplain
	b.must("POST", "/api/v1/placement/explain", b.tenant, apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 4}, 200, &ex)
	if !ex.Feasible || len(ex.Choices) != 0 || !strings.Contains(ex.Message, "fit now on one host") {
		t.Fatalf("tenant explain = %+v", ex)
	}
	b.must("POST", "/api/v1/placement/explain", b.admin, apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 4}, 200, &ex)
	if !ex.Feasible || len(ex.Choices) == 0 || ex.Choices[0].NodeName == "" {
		t.Fatalf("admin explain = %+v", ex)
	}
	var caps apiv1.List[apiv1.Capacity]
	b.must("GET", "/api/v1/capacity?sku=h200-sxm-slice", b.tenant, nil, 200, &caps)
	if len(caps.Items) != 1 || caps.Items[0].RawFreeSlots != 8 || caps.Items[0].Launchable["4"] != 2 || caps.Items[0].Launchable["8"] != 1 {
		t.Fatalf("capacity = %+v", caps.Items)
	}
}

func TestBadInputRejectedCleanly(t *testing.T) {
	b := setup(t)
	b.world()
	cases := []struct {
		name, method, path, token string
		body                      any
		want                      int
	}{
		{"unknown field", "POST", "/api/v1/allocations", b.tenant, `{"sku":"h200-sxm-slice","gpus":1,"gpu":2}`, 400},
		{"two objects", "POST", "/api/v1/allocations", b.tenant, `{"sku":"x","gpus":1}{}`, 400},
		{"empty body", "POST", "/api/v1/allocations", b.tenant, ``, 400},
		{"huge body", "POST", "/api/v1/allocations", b.tenant, `{"sku":"` + strings.Repeat("a", 2<<20) + `"}`, 413},
		{"zero gpus", "POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice"}, 400},
		{"unknown sku", "POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "nope", GPUs: 1}, 404},
		{"bad ssh key", "POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1, SSHPublicKeys: []string{"not a key"}}, 400},
		{"bad alloc id", "GET", "/api/v1/allocations/../../etc", b.tenant, nil, 404},
		{"bad node name", "POST", "/api/v1/admin/nodes", b.admin, apiv1.NodeCreate{Name: "Bad Name", Region: "lab"}, 400},
		{"slice sku as baremetal", "POST", "/api/v1/admin/nodes", b.admin, apiv1.NodeCreate{Name: "n9", Region: "lab", SKU: "h200-sxm-slice"}, 400},
		{"duplicate node", "POST", "/api/v1/admin/nodes", b.admin, apiv1.NodeCreate{Name: "n1", Region: "lab"}, 409},
		{"raw nvme path", "PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: []apiv1.SlotSpec{withNVMe(fixtures.H200Slot(1, 0), "/dev/nvme0n1")}}, 400},
		{"duplicate vf", "PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: dupVF()}, 400},
		{"bad token ttl", "POST", "/api/v1/admin/tokens", b.admin, apiv1.TokenCreate{Name: "x", Role: "admin", TTL: "forever"}, 400},
	}
	for _, c := range cases {
		code, body := b.do(c.method, c.path, c.token, c.body)
		if code != c.want {
			t.Errorf("%s: %d, want %d: %.200s", c.name, code, c.want, body)
			continue
		}
		apiError(t, body)
	}
	// Nothing was half-written: still exactly 8 slots on n1, none changed.
	var slots apiv1.List[apiv1.Slot]
	b.must("GET", "/api/v1/admin/nodes/n1/slots", b.admin, nil, 200, &slots)
	if len(slots.Items) != 8 || slots.Items[0].NVMeDevice == "/dev/nvme0n1" {
		t.Fatalf("slots after rejected applies: %d", len(slots.Items))
	}
}

func withNVMe(s apiv1.SlotSpec, dev string) apiv1.SlotSpec { s.NVMeDevice = dev; return s }

func dupVF() []apiv1.SlotSpec {
	m := fixtures.H200SlotMap(1)
	m[1].CapacityMetadata["fabric_vf_pci_address"] = m[0].CapacityMetadata["fabric_vf_pci_address"]
	return m
}

func TestSlotApplyDryRunAndConflicts(t *testing.T) {
	b := setup(t)
	b.world()
	m := fixtures.H200SlotMap(1)[:6] // drop slots 6, 7
	m[0].GPUModel = "NVIDIA H200 NVL"
	var res apiv1.SlotApplyResult
	b.must("PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: m, DryRun: true}, 200, &res)
	if res.Applied || res.Changes[0].Action != "update" || res.Changes[0].Fields[0] != "gpu_model" || res.Changes[6].Action != "disable" {
		t.Fatalf("dry run = %+v", res)
	}
	var slots apiv1.List[apiv1.Slot]
	b.must("GET", "/api/v1/admin/nodes/n1/slots", b.admin, nil, 200, &slots)
	if slots.Items[0].GPUModel != "NVIDIA H200" || slots.Items[6].Status != "available" {
		t.Fatal("dry run wrote changes")
	}
	// A live claim on slot 0 blocks changing slot 0.
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, nil)
	code, body := b.do("PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: m})
	if code != 409 || !strings.Contains(apiError(t, body).Message, "in use") {
		t.Fatalf("apply over a live claim = %d %s", code, body)
	}
	// Disabling a claimed slot is refused; disabling a free one works and is undone by enable.
	if code, _ := b.do("POST", "/api/v1/admin/nodes/n1/slots/0/disable", b.admin, nil); code != 409 {
		t.Fatalf("disable claimed slot = %d", code)
	}
	var sl apiv1.Slot
	b.must("POST", "/api/v1/admin/nodes/n1/slots/7/disable", b.admin, nil, 200, &sl)
	if sl.Status != "disabled" {
		t.Fatalf("slot 7 = %s", sl.Status)
	}
	b.must("POST", "/api/v1/admin/nodes/n1/slots/7/enable", b.admin, nil, 200, &sl)
	if sl.Status != "available" {
		t.Fatalf("slot 7 = %s", sl.Status)
	}
}

func TestNodeShowModeAndDrain(t *testing.T) {
	b := setup(t)
	b.world()
	var n apiv1.Node
	b.must("GET", "/api/v1/admin/nodes/n1", b.admin, nil, 200, &n)
	if n.Mode != "both_capable" || !n.Schedulable.Slice || n.SlotSummary.Total != 8 || n.SlotSummary.ByStatus["available"] != 8 {
		t.Fatalf("node = %+v", n)
	}
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, nil)
	b.must("GET", "/api/v1/admin/nodes/n1", b.admin, nil, 200, &n)
	if n.Mode != "slice_active" || n.Schedulable.Baremetal || n.SlotSummary.LiveSlotClaims != 1 {
		t.Fatalf("node after slice = %+v", n)
	}
	b.must("POST", "/api/v1/admin/nodes/n1/drain", b.admin, nil, 200, &n)
	if n.Mode != "draining" || n.Schedulable.Slice {
		t.Fatalf("drained node = %+v", n)
	}
	code, body := b.do("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1})
	if code != 409 || apiError(t, body).Details["reason"] != "node_draining" {
		t.Fatalf("create on drained = %d %s", code, body)
	}
	b.must("POST", "/api/v1/admin/nodes/n1/undrain", b.admin, nil, 200, &n)
	if n.Draining {
		t.Fatal("undrain did not clear draining")
	}
}

func TestCreateSKU(t *testing.T) {
	b := setup(t)
	b200 := apiv1.SKU{SKU: "b200-slice", Vendor: "NVIDIA", DisplayName: "B200 GPU VM", CapacityShape: "gpu_slice", GPUsTotal: 8,
		AllowedGPUCounts: []int{1, 2, 4, 8}, GPUHourlyPriceMinor: 600, NetworkFabric: "infiniband", Active: true,
		ResourceProfile: []byte(`{"default_slice_vm_profile":"b200_1g","slice_vm_profiles":{"b200_1g":{"gpu_count":1,"vcpu_count":28,"memory_mib":131072}}}`)}
	var out apiv1.SKU
	b.must("POST", "/api/v1/admin/skus", b.admin, b200, 201, &out)
	if out.SKU != "b200-slice" || out.ExclusiveNode || out.Currency != "USD" {
		t.Fatalf("created = %+v", out)
	}
	if code, _ := b.do("POST", "/api/v1/admin/skus", b.admin, b200); code != 409 {
		t.Fatalf("duplicate SKU = %d", code)
	}
	bad := b200
	bad.SKU, bad.AllowedGPUCounts = "b200-bad", []int{4, 2}
	if code, body := b.do("POST", "/api/v1/admin/skus", b.admin, bad); code != 400 || !strings.Contains(string(body), "increasing") {
		t.Fatalf("unordered counts = %d %s", code, body)
	}
	bm := apiv1.SKU{SKU: "b200-bm", Vendor: "NVIDIA", DisplayName: "B200 node", CapacityShape: "baremetal", GPUsTotal: 8, AllowedGPUCounts: []int{1, 8}}
	if code, body := b.do("POST", "/api/v1/admin/skus", b.admin, bm); code != 400 || !strings.Contains(string(body), "whole node") {
		t.Fatalf("baremetal with partial counts = %d %s", code, body)
	}
	bm.AllowedGPUCounts = []int{8}
	b.must("POST", "/api/v1/admin/skus", b.admin, bm, 201, &out)
	if !out.ExclusiveNode {
		t.Fatal("baremetal SKU not exclusive")
	}
	if code, _ := b.do("POST", "/api/v1/admin/skus", b.tenant, bm); code != 401 && code != 403 {
		t.Fatalf("tenant created a SKU: %d", code)
	}
}
