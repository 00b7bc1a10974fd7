package api_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// simController is one controller (API + dispatcher) on a shared database, with or without
// --allow-simulated-hosts, the way internal/controller wires it.
type simController struct {
	srv    *httptest.Server
	api    *api.Server
	client *http.Client
}

func startSimController(t *testing.T, dsn, pkiDir string, allow bool) *simController {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, dsn, store.Options{AllowSimulated: allow, AllowUntestedImages: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ca, _ := pki.LoadCA(pkiDir)
	key, _ := pki.LoadSigningKey(pkiDir)
	pub, _ := os.ReadFile(pki.Paths{Dir: pkiDir}.SigningPub())
	svc := alloc.New(st, alloc.Config{AllowSimulated: allow})
	d := dispatch.New(st, svc, key, nil, dispatch.Config{AllowSimulated: allow})
	apiSrv := api.New(api.Options{Store: st, Alloc: svc, Dispatch: d, CA: ca, SigningPub: pub})
	srv := httptest.NewUnstartedServer(apiSrv.Handler())
	if srv.TLS, err = pki.ServerTLSConfig(pkiDir); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &simController{srv: srv, api: apiSrv, client: httpClient(t, pki.Paths{Dir: pkiDir}.CACert(), nil)}
}

// A host enrolled with the sim runtime is recorded as simulated, and a controller started
// without --allow-simulated-hosts sells nothing on it: the tenant's create is sku_unavailable
// in our words (no host named, nothing written), the admin's explain and node view say why.
// The same database behind a controller with the flag sells it. The mark survives heartbeats
// that stop saying sim; only enrolling the node again with a new bootstrap token clears it.
func TestSimulatedHostIsNotSoldWithoutTheFlag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	dir := t.TempDir()
	if _, err := pki.Init(pki.InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, dsn, store.Options{AllowUntestedImages: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	sql, err := pgx.Connect(ctx, dsn) // plain SQL, as anyone with a database login
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sql.Close(ctx) })
	const admin, tenantTok = "gpa_sim_test_admin", "gpa_sim_test_tenant"
	err = st.InTx(ctx, func(tx *store.Tx) error {
		if _, err := tx.CreateToken(ctx, "admin", pki.HashToken(admin), "admin", "", nil); err != nil {
			return err
		}
		tn, err := tx.CreateTenant(ctx, "acme")
		if err != nil {
			return err
		}
		if _, err := tx.CreateToken(ctx, "acme", pki.HashToken(tenantTok), "tenant", tn.ID, nil); err != nil {
			return err
		}
		_, err = tx.CreateImage(ctx, apiv1.OSImage{Slug: "img", DisplayName: "i", Version: "1", Target: "vm_slice", Family: "debian",
			Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://x/i", DigestSHA256: strings.Repeat("cd", 32),
			DefaultUsername: "d", DriverStrategy: "none", Active: true})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	strict := startSimController(t, dsn, dir, false)
	url := strict.srv.URL

	code, body := call(t, strict.client, "POST", url+"/api/v1/admin/nodes", admin, apiv1.NodeCreate{Name: "simhost-07", Region: "lab", SliceSKU: "h200-sxm-slice"})
	var node apiv1.Node
	if err := json.Unmarshal(body, &node); code != 201 || err != nil {
		t.Fatalf("node create = %d %s", code, body)
	}
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.ApplySlots(ctx, node.ID, fixtures.H200SlotMap(1), false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Bad input: an unknown runtime is refused in our words, and consumes no token.
	_, pubPEM := enrollKey(t)
	code, body = call(t, strict.client, "POST", url+"/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: node.BootstrapToken, PublicKeyPEM: pubPEM, Runtime: "qemu\n"})
	if code != 400 || !strings.Contains(string(body), "runtime must be libvirt, lab or sim") {
		t.Fatalf("enroll with an unknown runtime = %d %s", code, body)
	}
	nodeClient := enrollAs(t, strict, dir, node.BootstrapToken, "sim")

	getNode := func(c *simController) apiv1.Node {
		t.Helper()
		code, body := call(t, c.client, "GET", c.srv.URL+"/api/v1/admin/nodes/simhost-07", admin, nil)
		var n apiv1.Node
		if err := json.Unmarshal(body, &n); code != 200 || err != nil {
			t.Fatalf("node show = %d %s", code, body)
		}
		return n
	}
	if n := getNode(strict); !n.Simulated || n.Schedulable.Slice || !strings.Contains(strings.Join(n.Schedulable.Reasons, "; "), "simulated host (sim runtime or lab host): not sold") {
		t.Fatalf("node after a sim enrollment: simulated=%v schedulable=%+v", n.Simulated, n.Schedulable)
	}

	// The tenant is refused, with no host identity in the answer and nothing written.
	req := apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}
	code, body = call(t, strict.client, "POST", url+"/api/v1/allocations", tenantTok, req)
	e := apiv1.Error{}
	_ = json.Unmarshal(body, &e)
	if e.Code != apiv1.CodeSKUUnavailable || e.Details["reason"] != apiv1.ReasonSimulatedHosts || !strings.Contains(e.Message, "simulated hosts") {
		t.Fatalf("create on a simulated host = %d %s, want sku_unavailable / %s", code, body, apiv1.ReasonSimulatedHosts)
	}
	for _, leak := range []string{"simhost-07", node.ID, "SELECT", "gpuaas.allow_simulated"} {
		if strings.Contains(string(body), leak) {
			t.Fatalf("refusal leaks %q: %s", leak, body)
		}
	}
	var n int
	if err := sql.QueryRow(ctx, `SELECT (SELECT count(*) FROM allocations) + (SELECT count(*) FROM allocation_resource_claims)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after the refusal: %d %v", n, err)
	}
	// The admin's explain says why.
	code, body = call(t, strict.client, "POST", url+"/api/v1/placement/explain", admin, apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 1})
	var ex apiv1.PlacementExplain
	if err := json.Unmarshal(body, &ex); code != 200 || err != nil || ex.Feasible || ex.Reason != apiv1.ReasonSimulatedHosts {
		t.Fatalf("explain = %d %s", code, body)
	}

	// Heartbeats that stop saying sim do not clear the mark.
	hb := apiv1.Heartbeat{AgentVersion: "t", Runtime: "lab"}
	if code, body := call(t, nodeClient, "POST", url+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("heartbeat = %d %s", code, body)
	}
	if err := strict.api.FlushHeartbeats(ctx); err != nil {
		t.Fatal(err)
	}
	if !getNode(strict).Simulated {
		t.Fatal("a heartbeat saying lab cleared the simulated mark")
	}
	// Nor does a plain UPDATE: only the enrollment transaction may.
	if _, err := sql.Exec(ctx, `UPDATE nodes SET simulated = false WHERE name = 'simhost-07'`); err == nil || !strings.Contains(err.Error(), "only re-enrolling it") {
		t.Fatalf("clearing the mark by SQL: %v", err)
	}

	// A controller started with --allow-simulated-hosts sells it, and says so.
	lax := startSimController(t, dsn, dir, true)
	code, body = call(t, lax.client, "POST", lax.srv.URL+"/api/v1/allocations", tenantTok, req)
	var a apiv1.Allocation
	if err := json.Unmarshal(body, &a); code != 201 || err != nil || !a.Simulated {
		t.Fatalf("create with --allow-simulated-hosts = %d %s, want 201 and simulated", code, body)
	}
	if n := getNode(lax); !n.Schedulable.Slice || !strings.Contains(strings.Join(n.Schedulable.Reasons, "; "), "sold only because the controller allows simulated hosts") {
		t.Fatalf("node on the permissive controller: %+v", n.Schedulable)
	}

	// Enrolled again (an admin's new token) with a real runtime, the node is real again; a
	// sim heartbeat marks it once more.
	code, body = call(t, strict.client, "POST", url+"/api/v1/admin/nodes/simhost-07/bootstrap-token", admin, nil)
	var bt apiv1.BootstrapToken
	if err := json.Unmarshal(body, &bt); code != 201 || err != nil {
		t.Fatalf("bootstrap token = %d %s", code, body)
	}
	nodeClient = enrollAs(t, strict, dir, bt.Token, "lab")
	if getNode(strict).Simulated {
		t.Fatal("re-enrolled with the lab runtime, the node is still simulated")
	}
	hb.Runtime = "sim"
	if code, body := call(t, nodeClient, "POST", url+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("heartbeat = %d %s", code, body)
	}
	if err := strict.api.FlushHeartbeats(ctx); err != nil {
		t.Fatal(err)
	}
	if !getNode(strict).Simulated {
		t.Fatal("a sim heartbeat did not mark the node simulated")
	}
}

// enrollAs enrolls a node with its bootstrap token, reporting runtime, and returns an mTLS
// client holding its new certificate.
func enrollAs(t *testing.T, c *simController, pkiDir, token, runtime string) *http.Client {
	t.Helper()
	key, pubPEM := enrollKey(t)
	code, body := call(t, c.client, "POST", c.srv.URL+"/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: token, PublicKeyPEM: pubPEM, Runtime: runtime})
	var en apiv1.Enrollment
	if err := json.Unmarshal(body, &en); code != 201 || err != nil {
		t.Fatalf("enroll = %d %s", code, body)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	cert, err := tls.X509KeyPair([]byte(en.CertificatePEM), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return httpClient(t, pki.Paths{Dir: pkiDir}.CACert(), &cert)
}
