package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// fakeServer is a TLS server with one handler per "METHOD /path"; it records requests.
type fakeServer struct {
	*httptest.Server
	CAFile string

	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	Method, Path, Query string
	Header              http.Header
	Body                string
}

func newFake(t *testing.T, routes map[string]http.HandlerFunc) *fakeServer {
	t.Helper()
	fs := &fakeServer{}
	fs.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fs.mu.Lock()
		fs.reqs = append(fs.reqs, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), string(b)})
		fs.mu.Unlock()
		if h, ok := routes[r.Method+" "+r.URL.Path]; ok {
			h(w, r)
			return
		}
		reply(404, apiv1.Error{Code: apiv1.CodeNotFound, Message: "no such endpoint: " + r.URL.Path})(w, r)
	}))
	fs.Config.ErrorLog = log.New(io.Discard, "", 0) // handshake failures are expected in one test
	fs.StartTLS()
	t.Cleanup(fs.Close)
	fs.CAFile = filepath.Join(t.TempDir(), "ca.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: fs.Certificate().Raw})
	if err := os.WriteFile(fs.CAFile, ca, 0o644); err != nil {
		t.Fatal(err)
	}
	return fs
}

func (fs *fakeServer) last(t *testing.T) recorded {
	t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.reqs) == 0 {
		t.Fatal("no request reached the server")
	}
	return fs.reqs[len(fs.reqs)-1]
}

func reply(status int, v any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
}

func newClient(t *testing.T, fs *fakeServer) *Client {
	t.Helper()
	c, err := New(Options{Server: fs.URL, CAFile: fs.CAFile, Token: "tok-123", UserAgent: "test/1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewRefusesPlainHTTPAndBadAddresses(t *testing.T) {
	for _, s := range []string{"", "http://127.0.0.1:8443", "127.0.0.1:8443", "ftp://x", "https://u:p@host", "https://host?x=1"} {
		_, err := New(Options{Server: s})
		if !errors.Is(err, ErrInvalidServer) {
			t.Errorf("New(%q) = %v, want ErrInvalidServer", s, err)
		}
	}
	_, err := New(Options{Server: "http://ctl:8443"})
	if err == nil || !strings.Contains(err.Error(), "https://") {
		t.Fatalf("http:// error should point at https://: %v", err)
	}
	if _, err := New(Options{Server: "https://ctl:8443/"}); err != nil {
		t.Fatalf("https accepted: %v", err)
	}
	if _, err := New(Options{Server: "https://ctl:8443", CAFile: filepath.Join(t.TempDir(), "missing.pem")}); err == nil {
		t.Fatal("missing CA file accepted")
	}
}

func TestAuthHeaderUserAgentAndDecoding(t *testing.T) {
	fs := newFake(t, map[string]http.HandlerFunc{
		"GET /api/v1/whoami": reply(200, apiv1.Whoami{Name: "ops", Role: "admin"}),
		"GET /api/v1/capacity": reply(200, apiv1.List[apiv1.Capacity]{Items: []apiv1.Capacity{
			{SKU: "h200-sxm-slice", Region: "lab", Launchable: map[string]int{"1": 8}}}}),
		"GET /api/v1/admin/nodes": reply(200, map[string]any{"items": nil}),
	})
	c := newClient(t, fs)
	w, err := c.Whoami(context.Background())
	if err != nil || w.Name != "ops" || w.Role != "admin" {
		t.Fatalf("whoami = %+v, %v", w, err)
	}
	r := fs.last(t)
	if got := r.Header.Get("Authorization"); got != "Bearer tok-123" {
		t.Fatalf("Authorization = %q", got)
	}
	if got := r.Header.Get("User-Agent"); got != "test/1" {
		t.Fatalf("User-Agent = %q", got)
	}
	caps, err := c.Capacity(context.Background(), "h200-sxm-slice", "lab")
	if err != nil || len(caps) != 1 || caps[0].Launchable["1"] != 8 {
		t.Fatalf("capacity = %+v, %v", caps, err)
	}
	if q := fs.last(t).Query; q != "region=lab&sku=h200-sxm-slice" {
		t.Fatalf("capacity query = %q", q)
	}
	nodes, err := c.ListNodes(context.Background())
	if err != nil || nodes == nil || len(nodes) != 0 {
		t.Fatalf("empty list should be a non-nil empty slice: %#v, %v", nodes, err)
	}
}

func TestNoTokenSendsNoAuthorization(t *testing.T) {
	fs := newFake(t, map[string]http.HandlerFunc{"GET /healthz": reply(200, map[string]string{"status": "ok"})})
	c, err := New(Options{Server: fs.URL, CAFile: fs.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Healthz(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h := fs.last(t).Header.Get("Authorization"); h != "" {
		t.Fatalf("Authorization sent without a token: %q", h)
	}
}

func TestCreateAllocationSendsIdempotencyKeyAndBody(t *testing.T) {
	fs := newFake(t, map[string]http.HandlerFunc{
		"POST /api/v1/allocations": reply(201, apiv1.Allocation{ID: "a1", Status: "requested", SKU: "s", GPUs: 2}),
	})
	c := newClient(t, fs)
	req := apiv1.AllocationCreate{SKU: "s", GPUs: 2, Region: "lab", SSHPublicKeys: []string{"ssh-ed25519 AAAA x"}}
	a, err := c.CreateAllocation(context.Background(), req, "key-1")
	if err != nil || a.ID != "a1" {
		t.Fatalf("create = %+v, %v", a, err)
	}
	r := fs.last(t)
	if r.Header.Get("Idempotency-Key") != "key-1" || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("headers = %v", r.Header)
	}
	var sent apiv1.AllocationCreate
	if err := json.Unmarshal([]byte(r.Body), &sent); err != nil || sent.SKU != "s" || sent.GPUs != 2 || sent.Region != "lab" || len(sent.SSHPublicKeys) != 1 {
		t.Fatalf("body = %s (%v)", r.Body, err)
	}
	if _, err := c.CreateAllocation(context.Background(), req, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := fs.last(t).Header["Idempotency-Key"]; ok {
		t.Fatal("empty key should send no Idempotency-Key header")
	}
}

func TestRoutesAndMethods(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) { reply(200, map[string]any{})(w, r) }
	routes := map[string]http.HandlerFunc{}
	for _, k := range []string{
		"POST /api/v1/admin/nodes/h200 01/drain", "POST /api/v1/admin/nodes/n1/undrain",
		"POST /api/v1/admin/nodes/n1/slots/3/disable", "POST /api/v1/admin/nodes/n1/slots/3/enable",
		"PUT /api/v1/admin/nodes/n1/slots", "DELETE /api/v1/admin/os-images/ubuntu",
		"PATCH /api/v1/admin/skus/s1", "POST /api/v1/allocations/a1/release", "GET /api/v1/admin/audit",
	} {
		routes[k] = ok
	}
	fs := newFake(t, routes)
	c := newClient(t, fs)
	ctx := context.Background()
	check := func(err error, method, path, query string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		r := fs.last(t)
		if r.Method != method || r.Path != path || r.Query != query {
			t.Fatalf("got %s %s?%s, want %s %s?%s", r.Method, r.Path, r.Query, method, path, query)
		}
	}
	_, err := c.DrainNode(ctx, "h200 01")
	check(err, "POST", "/api/v1/admin/nodes/h200 01/drain", "")
	_, err = c.UndrainNode(ctx, "n1")
	check(err, "POST", "/api/v1/admin/nodes/n1/undrain", "")
	_, err = c.DisableSlot(ctx, "n1", 3)
	check(err, "POST", "/api/v1/admin/nodes/n1/slots/3/disable", "")
	_, err = c.EnableSlot(ctx, "n1", 3)
	check(err, "POST", "/api/v1/admin/nodes/n1/slots/3/enable", "")
	_, err = c.ApplySlots(ctx, "n1", apiv1.SlotApply{DryRun: true})
	check(err, "PUT", "/api/v1/admin/nodes/n1/slots", "")
	if !strings.Contains(fs.last(t).Body, `"dry_run":true`) {
		t.Fatalf("slot apply body = %s", fs.last(t).Body)
	}
	_, err = c.RetireImage(ctx, "ubuntu")
	check(err, "DELETE", "/api/v1/admin/os-images/ubuntu", "")
	_, err = c.DeleteImage(ctx, "ubuntu")
	check(err, "DELETE", "/api/v1/admin/os-images/ubuntu", "hard=true")
	_, err = c.PatchSKU(ctx, "s1", apiv1.SKUPatch{})
	check(err, "PATCH", "/api/v1/admin/skus/s1", "")
	_, err = c.ReleaseAllocation(ctx, "a1")
	check(err, "POST", "/api/v1/allocations/a1/release", "")
	_, err = c.ListAudit(ctx, AuditQuery{Limit: 5})
	check(err, "GET", "/api/v1/admin/audit", "limit=5")
}

func TestErrorDecoding(t *testing.T) {
	fs := newFake(t, map[string]http.HandlerFunc{
		"POST /api/v1/allocations": reply(409, apiv1.Error{Code: apiv1.CodeSKUUnavailable, Message: "no capacity",
			Details: map[string]any{"reason": apiv1.ReasonTopologyFragmented}}),
		"GET /api/v1/whoami": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(502)
			_, _ = io.WriteString(w, "<html>bad gateway</html>")
		},
		"GET /readyz": func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) },
	})
	c := newClient(t, fs)
	_, err := c.CreateAllocation(context.Background(), apiv1.AllocationCreate{SKU: "s", GPUs: 8}, "k")
	var ae *apiv1.Error
	if !errors.As(err, &ae) || ae.Code != apiv1.CodeSKUUnavailable || ae.Details["reason"] != apiv1.ReasonTopologyFragmented {
		t.Fatalf("json error = %#v", err)
	}
	_, err = c.Whoami(context.Background())
	if !errors.As(err, &ae) || ae.Code != apiv1.CodeUnavailable || !strings.Contains(ae.Message, "bad gateway") {
		t.Fatalf("non-JSON error = %#v", err)
	}
	if err := c.Readyz(context.Background()); !errors.As(err, &ae) || ae.Code != apiv1.CodeUnavailable {
		t.Fatalf("empty 503 = %#v", err)
	}
	_, err = c.GetAllocation(context.Background(), "nope")
	if !errors.As(err, &ae) || ae.Code != apiv1.CodeNotFound {
		t.Fatalf("404 = %#v", err)
	}
	if errors.Is(err, ErrUnreachable) {
		t.Fatal("an API error is not a network error")
	}
}

func TestNetworkErrorsAreRecognisable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c, err := New(Options{Server: "https://" + addr, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Whoami(context.Background())
	var ne *NetworkError
	if !errors.Is(err, ErrUnreachable) || !errors.As(err, &ne) || ne.URL != "https://"+addr {
		t.Fatalf("connection refused = %#v", err)
	}
	if !strings.Contains(err.Error(), "cannot reach controller at https://"+addr) {
		t.Fatalf("message = %q", err)
	}

	// A server whose CA we were not given: certificate verification fails, still "unreachable",
	// with the TLS cause available to callers that want to hint at --ca-file.
	fs := newFake(t, nil)
	c, err = New(Options{Server: fs.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Whoami(context.Background())
	var cv *tls.CertificateVerificationError
	if !errors.Is(err, ErrUnreachable) || !errors.As(err, &cv) {
		t.Fatalf("untrusted certificate = %#v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := newClient(t, fs).Whoami(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) {
		t.Fatalf("cancelled context = %#v", err)
	}
}

func TestResponseSizeIsLimited(t *testing.T) {
	big := strings.Repeat("x", 4096)
	fs := newFake(t, map[string]http.HandlerFunc{
		"GET /api/v1/whoami": reply(200, apiv1.Whoami{Name: big}),
	})
	c := newClient(t, fs)
	c.maxBody = 1024
	if _, err := c.Whoami(context.Background()); err == nil || !strings.Contains(err.Error(), "exceeds 1024 bytes") {
		t.Fatalf("oversized response = %v", err)
	}
	c.maxBody = MaxResponseBytes
	if w, err := c.Whoami(context.Background()); err != nil || w.Name != big {
		t.Fatalf("normal response: %v", err)
	}
}

func TestServerPathPrefixIsKept(t *testing.T) {
	fs := newFake(t, map[string]http.HandlerFunc{"GET /gpuaas/api/v1/whoami": reply(200, apiv1.Whoami{Name: "x"})})
	c, err := New(Options{Server: fs.URL + "/gpuaas/", CAFile: fs.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Whoami(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.Server() != fs.URL+"/gpuaas" {
		t.Fatalf("Server() = %q", c.Server())
	}
}

// The client speaks HTTP/1.1 with keep-alive even to a server that offers h2: its calls are
// sequential, and HTTP/2's stream hand-offs cost latency (docs/performance.md).
func TestClientSpeaksHTTP1WithKeepAlive(t *testing.T) {
	var mu sync.Mutex
	var protos []string
	remotes := map[string]bool{}
	fs := &fakeServer{}
	fs.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		protos, remotes[r.RemoteAddr] = append(protos, r.Proto), true
		mu.Unlock()
		reply(200, apiv1.Whoami{Name: "ops", Role: "admin"})(w, r)
	}))
	fs.EnableHTTP2 = true
	fs.StartTLS()
	t.Cleanup(fs.Close)
	fs.CAFile = filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(fs.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: fs.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, fs)
	for range 3 {
		if _, err := c.Whoami(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(protos, ",") != "HTTP/1.1,HTTP/1.1,HTTP/1.1" || len(remotes) != 1 {
		t.Fatalf("protocols %v over %d connections, want HTTP/1.1 x3 over one kept-alive connection", protos, len(remotes))
	}
}
