package api_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// agentSetup runs the API with the real controller PKI (mTLS) and dispatcher.
func agentSetup(t *testing.T) (srv *httptest.Server, apiSrv *api.Server, dir, admin string) {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, pgtest.NewDatabase(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	dir = t.TempDir()
	if _, err := pki.Init(pki.InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca, _ := pki.LoadCA(dir)
	key, _ := pki.LoadSigningKey(dir)
	pub, _ := os.ReadFile(pki.Paths{Dir: dir}.SigningPub())
	admin = "gpa_agent_test_admin"
	_ = st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.CreateToken(ctx, "admin", pki.HashToken(admin), "admin", "", nil)
		return err
	})
	svc := alloc.New(st, alloc.Config{})
	d := dispatch.New(st, svc, key, nil, dispatch.Config{})
	apiSrv = api.New(api.Options{Store: st, Alloc: svc, Dispatch: d, CA: ca, SigningPub: pub})
	srv = httptest.NewUnstartedServer(apiSrv.Handler())
	if srv.TLS, err = pki.ServerTLSConfig(dir); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, apiSrv, dir, admin
}

func httpClient(t *testing.T, caFile string, cert *tls.Certificate) *http.Client {
	t.Helper()
	cfg, err := pki.ClientTLSConfig(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
}

func call(t *testing.T, c *http.Client, method, url, bearer string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	req, _ := http.NewRequest(method, url, rd)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func enrollKey(t *testing.T) (*ecdsa.PrivateKey, string) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	return key, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func TestAgentEndpointsSecurityMatrix(t *testing.T) {
	srv, apiSrv, dir, admin := agentSetup(t)
	caFile := pki.Paths{Dir: dir}.CACert()
	plain := httpClient(t, caFile, nil)

	code, body := call(t, plain, "POST", srv.URL+"/api/v1/admin/nodes", admin, apiv1.NodeCreate{Name: "n1", Region: "lab"})
	var node apiv1.Node
	_ = json.Unmarshal(body, &node)
	if code != 201 || !strings.HasPrefix(node.BootstrapToken, "gpb_") {
		t.Fatalf("node create = %d %s", code, body)
	}
	key, pubPEM := enrollKey(t)
	code, body = call(t, plain, "POST", srv.URL+"/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: node.BootstrapToken, PublicKeyPEM: pubPEM})
	var en apiv1.Enrollment
	_ = json.Unmarshal(body, &en)
	if code != 201 || en.NodeID != node.ID || !strings.Contains(en.TaskSigningPublicKeyPEM, "PUBLIC KEY") {
		t.Fatalf("enroll = %d %s", code, body)
	}
	// Reuse and unknown tokens are refused.
	if code, _ := call(t, plain, "POST", srv.URL+"/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: node.BootstrapToken, PublicKeyPEM: pubPEM}); code != 401 {
		t.Fatalf("reused token = %d", code)
	}
	if code, _ := call(t, plain, "POST", srv.URL+"/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: "gpb_x", PublicKeyPEM: pubPEM}); code != 401 {
		t.Fatalf("unknown token = %d", code)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	cert, err := tls.X509KeyPair([]byte(en.CertificatePEM), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	nodeClient := httpClient(t, caFile, &cert)

	// The node certificate works on agent endpoints...
	if code, body := call(t, nodeClient, "GET", srv.URL+"/api/v1/agent/tasks?wait=0s", "", nil); code != 204 {
		t.Fatalf("node poll = %d %s", code, body)
	}
	if code, body := call(t, nodeClient, "GET", srv.URL+"/api/v1/agent/tasks?wait=0s&max=8", "", nil); code != 204 {
		t.Fatalf("node batch poll = %d %s", code, body)
	}
	for _, bad := range []string{"0", "65", "-1", "x", "1.5"} {
		if code, _ := call(t, nodeClient, "GET", srv.URL+"/api/v1/agent/tasks?wait=0s&max="+bad, "", nil); code != 400 {
			t.Fatalf("poll max=%s = %d, want 400", bad, code)
		}
	}
	for _, bad := range []string{"-1s", "61s", "9999999999h", "30", "%ff"} {
		if code, _ := call(t, nodeClient, "GET", srv.URL+"/api/v1/agent/tasks?wait="+bad, "", nil); code != 400 {
			t.Fatalf("poll wait=%s = %d, want 400", bad, code)
		}
	}
	if code, body := call(t, nodeClient, "POST", srv.URL+"/api/v1/agent/heartbeat", "", apiv1.Heartbeat{AgentVersion: "t", Runtime: "sim"}); code != 204 {
		t.Fatalf("heartbeat = %d %s", code, body)
	}
	// ...and nowhere else.
	if code, _ := call(t, nodeClient, "GET", srv.URL+"/api/v1/admin/nodes", "", nil); code != 401 {
		t.Fatalf("node cert on admin endpoint = %d", code)
	}
	// Bearer tokens (admin or tenant) never reach agent endpoints.
	if code, _ := call(t, plain, "GET", srv.URL+"/api/v1/agent/tasks?wait=0s", admin, nil); code != 401 {
		t.Fatalf("admin token on agent endpoint = %d", code)
	}
	// A certificate from another CA is refused during the TLS handshake.
	other := t.TempDir()
	_, _ = pki.Init(pki.InitOptions{Dir: other})
	oca, _ := pki.LoadCA(other)
	okey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ocertPEM, _ := oca.IssueClientCert(&okey.PublicKey, "node:"+node.ID, 3600e9, en.NotAfter.AddDate(0, -1, 0))
	okeyDER, _ := x509.MarshalECPrivateKey(okey)
	ocert, _ := tls.X509KeyPair(ocertPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: okeyDER}))
	if code, _ := call(t, httpClient(t, caFile, &ocert), "GET", srv.URL+"/api/v1/agent/tasks?wait=0s", "", nil); code == 200 || code == 204 {
		t.Fatalf("foreign-CA certificate accepted: %d", code)
	}
	// A flush that fails writes nothing and loses nothing: the next one writes it.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := apiSrv.FlushHeartbeats(cancelled); err == nil {
		t.Fatal("a flush with its context cancelled succeeded")
	}
	if code, body := call(t, plain, "GET", srv.URL+"/api/v1/admin/nodes/n1", admin, nil); code != 200 || strings.Contains(string(body), `"last_heartbeat"`) {
		t.Fatalf("node after a failed flush = %d %s, want no heartbeat yet", code, body)
	}
	// Heartbeat recorded on the node (buffered, then written in one batched statement).
	if err := apiSrv.FlushHeartbeats(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, body = call(t, plain, "GET", srv.URL+"/api/v1/admin/nodes/n1", admin, nil)
	if code != 200 || !strings.Contains(string(body), `"last_heartbeat"`) {
		t.Fatalf("node after heartbeat = %d %s", code, body)
	}
}
