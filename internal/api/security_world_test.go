package api_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// secWorld is the real API over real mTLS on a private database, with every kind of matrixCaller
// the authorization matrix distinguishes: two tenants, an admin, two enrolled hosts, and
// tokens that are expired or revoked.
type secWorld struct {
	t       *testing.T
	srv     *httptest.Server
	api     *api.Server
	st      *store.Store
	svc     *alloc.Service
	dir     string
	dbURL   string
	caFile  string
	plain   *http.Client // TLS, no client certificate
	admin   string
	tenA    string
	tenB    string
	tenAID  string
	tenBID  string
	expired string
	revoked string
	nodeX   enrolledNode
	nodeY   enrolledNode
	nodeZ   apiv1.Node // registered with slots, never enrolled: the target of admin actions
	imageID string
}

// enrolledNode is a host that exchanged a bootstrap token for a certificate.
type enrolledNode struct {
	apiv1.Node
	key    *ecdsa.PrivateKey
	cert   tls.Certificate
	serial string
	client *http.Client
}

// secSetup builds the world. sec tunes rate limits and renewal (zero: defaults).
func secSetup(t *testing.T, sec api.SecurityConfig) *secWorld {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	st, err := store.Open(ctx, url, store.Options{AllowUntestedImages: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	w := &secWorld{t: t, st: st, dir: t.TempDir(), dbURL: url, admin: "gpa_sec_admin_0123456789"}
	if _, err := pki.Init(pki.InitOptions{Dir: w.dir}); err != nil {
		t.Fatal(err)
	}
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.CreateToken(ctx, "sec-admin", pki.HashToken(w.admin), "admin", "", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	w.svc = alloc.New(st, alloc.Config{})
	w.srv, w.api = w.replica(sec)
	w.caFile = pki.Paths{Dir: w.dir}.CACert()
	w.plain = httpClient(t, w.caFile, nil)
	return w
}

// replica starts a controller API (one more replica when called again) on the world's
// database and PKI.
func (w *secWorld) replica(sec api.SecurityConfig) (*httptest.Server, *api.Server) {
	t := w.t
	t.Helper()
	ca, err := pki.LoadCA(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.LoadSigningKey(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(pki.Paths{Dir: w.dir}.SigningPub())
	if err != nil {
		t.Fatal(err)
	}
	d := dispatch.New(w.st, w.svc, key, nil, dispatch.Config{Lease: 30 * time.Minute})
	a := api.New(api.Options{Store: w.st, Alloc: w.svc, Dispatch: d, CA: ca, SigningPub: pub, Version: "test", Security: sec})
	srv := httptest.NewUnstartedServer(a.Handler())
	if srv.TLS, err = pki.ServerTLSConfig(w.dir); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, a
}

// populate adds the tenants, tokens, image and nodes (X and Y enrolled, Z with slots).
func (w *secWorld) populate() {
	t := w.t
	t.Helper()
	var ta, tb apiv1.Tenant
	w.must("POST", "/api/v1/admin/tenants", w.admin, map[string]string{"name": "tenant-a"}, 201, &ta)
	w.must("POST", "/api/v1/admin/tenants", w.admin, map[string]string{"name": "tenant-b"}, 201, &tb)
	w.tenAID, w.tenBID = ta.ID, tb.ID
	w.tenA = w.newToken("a-ci", "tenant", ta.ID).Token
	w.tenB = w.newToken("b-ci", "tenant", tb.ID).Token
	rv := w.newToken("a-revoked", "tenant", ta.ID)
	w.must("POST", "/api/v1/admin/tokens/"+rv.ID+"/revoke", w.admin, nil, 200, nil)
	w.revoked = rv.Token
	w.expired = "gpa_sec_expired_0123456789"
	past := time.Now().Add(-time.Minute)
	if err := w.st.InTx(context.Background(), func(tx *store.Tx) error {
		_, err := tx.CreateToken(context.Background(), "a-expired", pki.HashToken(w.expired), "tenant", ta.ID, &past)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var img apiv1.OSImage
	w.must("POST", "/api/v1/admin/os-images", w.admin, testImage("img"), 201, &img)
	w.imageID = img.ID
	w.nodeX = w.enroll("node-x")
	w.nodeY = w.enroll("node-y")
	w.must("POST", "/api/v1/admin/nodes", w.admin, apiv1.NodeCreate{Name: "node-z", Region: "lab", SKU: "h200-sxm-baremetal-8g",
		SliceSKU: "h200-sxm-slice", ProfileTags: []string{"gpuaas-profile-slice-vm"}}, 201, &w.nodeZ)
	w.must("PUT", "/api/v1/admin/nodes/node-z/slots", w.admin, apiv1.SlotApply{Slots: fixtures.H200SlotMap(1)}, 200, nil)
}

func testImage(slug string) apiv1.OSImage {
	return apiv1.OSImage{Slug: slug, DisplayName: slug, Version: "1", Target: "vm_slice", Family: "debian", Architecture: "amd64",
		ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://images.example/" + slug + ".qcow2", DigestSHA256: strings.Repeat("0f", 32),
		DefaultUsername: "debian", DriverStrategy: "none", Active: true}
}

func (w *secWorld) newToken(name, role, tenant string) apiv1.Token {
	w.t.Helper()
	var tok apiv1.Token
	w.must("POST", "/api/v1/admin/tokens", w.admin, apiv1.TokenCreate{Name: name, Role: role, TenantID: tenant}, 201, &tok)
	return tok
}

// enroll registers a node and enrolls it through the public endpoint with a fresh key.
func (w *secWorld) enroll(name string) enrolledNode {
	w.t.Helper()
	var n enrolledNode
	w.must("POST", "/api/v1/admin/nodes", w.admin, apiv1.NodeCreate{Name: name, Region: "lab"}, 201, &n.Node)
	key, pubPEM := enrollKey(w.t)
	var en apiv1.Enrollment
	w.must("POST", "/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: n.BootstrapToken, PublicKeyPEM: pubPEM}, 201, &en)
	n.key = key
	n.cert, n.serial = w.certOf(key, en.CertificatePEM)
	n.client = httpClient(w.t, w.caFile, &n.cert)
	return n
}

// certOf pairs a certificate with its key and returns its serial as the controller records it.
func (w *secWorld) certOf(key *ecdsa.PrivateKey, certPEM string) (tls.Certificate, string) {
	w.t.Helper()
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		w.t.Fatal(err)
	}
	cert, err := tls.X509KeyPair([]byte(certPEM), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		w.t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		w.t.Fatal(err)
	}
	return cert, hex.EncodeToString(leaf.SerialNumber.Bytes())
}

// do calls the API without a client certificate.
func (w *secWorld) do(method, path, bearer string, body any) (int, []byte) {
	w.t.Helper()
	return call(w.t, w.plain, method, w.srv.URL+path, bearer, body)
}

func (w *secWorld) must(method, path, bearer string, body any, want int, into any) {
	w.t.Helper()
	code, out := w.do(method, path, bearer, body)
	if code != want {
		w.t.Fatalf("%s %s = %d, want %d: %s", method, path, code, want, out)
	}
	if into != nil {
		if err := json.Unmarshal(out, into); err != nil {
			w.t.Fatalf("%s %s: %v: %s", method, path, err, out)
		}
	}
}

// activeAllocation creates an allocation for tenant A and drives it to active, as a host's
// provisioning result would.
func (w *secWorld) activeAllocation() string {
	w.t.Helper()
	ctx := context.Background()
	a, _, err := w.svc.Create(ctx, alloc.Actor{Role: "tenant", TenantID: w.tenAID}, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, "")
	if err != nil {
		w.t.Fatal(err)
	}
	if err := w.svc.MarkProvisioning(ctx, a.ID); err != nil {
		w.t.Fatal(err)
	}
	if err := w.svc.MarkActive(ctx, a.ID); err != nil {
		w.t.Fatal(err)
	}
	return a.ID
}

// leasedTasks queues n reconcile tasks on node and leases them to it; it returns their ids.
func (w *secWorld) leasedTasks(n enrolledNode, count int) []string {
	w.t.Helper()
	ids := make([]string, 0, count)
	for range count {
		var rc apiv1.Reconcile
		w.must("POST", "/api/v1/admin/nodes/"+n.ID+"/reconcile", w.admin, nil, 202, &rc)
		ids = append(ids, rc.TaskID)
	}
	leased := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for len(leased) < count {
		if time.Now().After(deadline) {
			w.t.Fatalf("node %s leased %d of %d tasks", n.Name, len(leased), count)
		}
		code, body := call(w.t, n.client, "GET", w.srv.URL+"/api/v1/agent/tasks?wait=1s&max=64", "", nil)
		if code == 200 {
			var b struct {
				Tasks []struct {
					TaskID string `json:"task_id"`
				} `json:"tasks"`
			}
			if err := json.Unmarshal(body, &b); err != nil {
				w.t.Fatalf("poll: %v %s", err, body)
			}
			for _, e := range b.Tasks {
				leased[e.TaskID] = true
			}
		} else if code != 204 {
			w.t.Fatalf("poll = %d %s", code, body)
		}
	}
	for _, id := range ids {
		if !leased[id] {
			w.t.Fatalf("task %s was not leased to %s", id, n.Name)
		}
	}
	return ids
}

// audits lists the audit rows of an action on a target.
func (w *secWorld) audits(action, target string) []apiv1.AuditEntry {
	w.t.Helper()
	var l apiv1.List[apiv1.AuditEntry]
	w.must("GET", "/api/v1/admin/audit?limit=1000&action="+action+"&target_id="+target, w.admin, nil, 200, &l)
	return l.Items
}
