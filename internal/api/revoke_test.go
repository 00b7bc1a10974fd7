package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// A revoked API token is refused on its very next request, although it was cached a moment
// before; the revocation is audited, cannot be repeated, and the token list shows it
// revoked without ever showing a secret.
func TestTokenRevocationIsImmediateAndAudited(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{})
	w.populate()
	var who apiv1.Whoami
	w.must("GET", "/api/v1/whoami", w.tenA, nil, 200, &who) // now cached for tokenCacheTTL
	w.must("GET", "/api/v1/whoami", w.tenA, nil, 200, nil)
	var rv apiv1.Token
	w.must("POST", "/api/v1/admin/tokens/"+who.TokenID+"/revoke", w.admin, nil, 200, &rv)
	if rv.RevokedAt == nil || rv.ID != who.TokenID || rv.Token != "" {
		t.Fatalf("revoke answer = %+v", rv)
	}
	code, body := w.do("GET", "/api/v1/whoami", w.tenA, nil)
	if code != 401 || !strings.Contains(string(body), "revoked") {
		t.Fatalf("revoked token right after revocation: %d %s", code, body)
	}
	w.must("GET", "/api/v1/whoami", w.tenB, nil, 200, nil) // others unaffected

	rows := w.audits("token.revoke", who.TokenID)
	if len(rows) != 1 || !strings.Contains(rows[0].Actor, "sec-admin") || rows[0].TargetKind != "api_token" {
		t.Fatalf("audit = %+v", rows)
	}
	for _, c := range []struct {
		id   string
		want int
	}{{who.TokenID, 409}, {"00000000-0000-0000-0000-000000000000", 404}, {"not-a-uuid", 400}} {
		if code, body := w.do("POST", "/api/v1/admin/tokens/"+c.id+"/revoke", w.admin, nil); code != c.want {
			t.Errorf("revoke %s = %d, want %d: %s", c.id, code, c.want, body)
		}
	}
	if n := len(w.audits("token.revoke", who.TokenID)); n != 1 {
		t.Fatalf("refused revocations wrote audit rows: %d", n)
	}

	code, body = w.do("GET", "/api/v1/admin/tokens", w.admin, nil)
	if code != 200 {
		t.Fatalf("list = %d %s", code, body)
	}
	for _, secret := range []string{w.admin, w.tenA, w.tenB, w.revoked, w.expired} {
		if strings.Contains(string(body), secret) {
			t.Fatalf("token list shows a secret: %s", body)
		}
	}
	if strings.Contains(string(body), "hash") {
		t.Fatalf("token list shows hashes: %s", body)
	}
	var list apiv1.List[apiv1.Token]
	_ = json.Unmarshal(body, &list)
	seen := false
	for _, tk := range list.Items {
		if tk.ID == who.TokenID {
			seen = tk.RevokedAt != nil && tk.CreatedAt != nil && tk.Name == "a-ci"
		}
	}
	if !seen || len(list.Items) < 5 {
		t.Fatalf("list lacks the revoked token: %s", body)
	}
}

// Revoking a node refuses its certificate at once (it was cached for minutes), spends its
// unused bootstrap token, leaves other hosts alone, is audited, and a fresh bootstrap token
// enrolls the host again.
func TestNodeRevocationIsImmediate(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{})
	w.populate()
	hb := apiv1.Heartbeat{AgentVersion: "t", Runtime: "sim"}
	if code, body := call(t, w.nodeX.client, "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("heartbeat before = %d %s", code, body)
	}
	var bt apiv1.BootstrapToken
	w.must("POST", "/api/v1/admin/nodes/"+w.nodeX.ID+"/bootstrap-token", w.admin, nil, 201, &bt)
	var rev apiv1.NodeRevocation
	w.must("POST", "/api/v1/admin/nodes/node-x/revoke", w.admin, nil, 200, &rev)
	if rev.NodeID != w.nodeX.ID || rev.RevokedCertificates != 1 || rev.RevokedBootstrapTokens != 1 {
		t.Fatalf("revocation = %+v", rev)
	}
	if code, body := call(t, w.nodeX.client, "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 401 {
		t.Fatalf("revoked node's heartbeat = %d %s", code, body)
	}
	_, pubPEM := enrollKey(t)
	if code, body := w.do("POST", "/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: bt.Token, PublicKeyPEM: pubPEM}); code != 401 {
		t.Fatalf("enroll with a token issued before the revocation = %d %s", code, body)
	}
	if code, body := call(t, w.nodeY.client, "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("node Y after X's revocation = %d %s", code, body)
	}
	rows := w.audits("node.revoke", w.nodeX.ID)
	if len(rows) != 1 || !strings.Contains(rows[0].Actor, "sec-admin") {
		t.Fatalf("audit = %+v", rows)
	}
	// Recovery: a new bootstrap token enrolls the host with a new certificate.
	w.must("POST", "/api/v1/admin/nodes/"+w.nodeX.ID+"/bootstrap-token", w.admin, nil, 201, &bt)
	key, pubPEM := enrollKey(t)
	var en apiv1.Enrollment
	w.must("POST", "/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: bt.Token, PublicKeyPEM: pubPEM}, 201, &en)
	cert, _ := w.certOf(key, en.CertificatePEM)
	if code, body := call(t, httpClient(t, w.caFile, &cert), "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("re-enrolled node = %d %s", code, body)
	}
}

// Another replica drops a revoked node from its cache through PostgreSQL NOTIFY: it refuses
// the certificate well before its own cache entry (2 minutes) would expire.
func TestNodeRevocationReachesOtherReplicas(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{})
	w.populate()
	srv2, api2 := w.replica(api.SecurityConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); api2.RunBackground(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	hb := apiv1.Heartbeat{AgentVersion: "t", Runtime: "sim"}
	if code, body := call(t, w.nodeX.client, "POST", srv2.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("heartbeat on replica 2 = %d %s", code, body)
	}
	// Revoke on replica 1 until replica 2 refuses (the first NOTIFY may precede replica 2's
	// LISTEN; revoking again is harmless and notifies again).
	start := time.Now()
	for {
		w.must("POST", "/api/v1/admin/nodes/"+w.nodeX.ID+"/revoke", w.admin, nil, 200, nil)
		code, _ := call(t, w.nodeX.client, "POST", srv2.URL+"/api/v1/agent/heartbeat", "", hb)
		if code == 401 {
			break
		}
		if code != 204 {
			t.Fatalf("replica 2 answered %d", code)
		}
		if time.Since(start) > 60*time.Second { // half the cache TTL: only the notification explains a refusal
			t.Fatal("replica 2 still accepts the revoked certificate after 60s")
		}
		time.Sleep(200 * time.Millisecond) // poll interval, bounded by the deadline above
	}
	if code, _ := call(t, w.nodeY.client, "POST", srv2.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("node Y on replica 2 = %d", code)
	}
}

// Renewal: the new certificate works and the one that asked for it is superseded — with a
// negligible grace it is refused at once (although it was cached), and the audit row names it.
func TestRenewalSupersedesTheOldCertificate(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{RenewGrace: time.Nanosecond})
	w.populate()
	hb := apiv1.Heartbeat{AgentVersion: "t", Runtime: "sim"}
	if code, _ := call(t, w.nodeX.client, "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatal("old certificate not working before renewal")
	}
	key, pubPEM := enrollKey(t)
	code, body := call(t, w.nodeX.client, "POST", w.srv.URL+"/api/v1/agent/renew", "", apiv1.EnrollRequest{PublicKeyPEM: pubPEM})
	if code != 201 {
		t.Fatalf("renew = %d %s", code, body)
	}
	var en apiv1.Enrollment
	_ = json.Unmarshal(body, &en)
	cert, serial := w.certOf(key, en.CertificatePEM)
	if serial == w.nodeX.serial || en.NodeID != w.nodeX.ID {
		t.Fatalf("renewal = %+v", en)
	}
	if code, body := call(t, httpClient(t, w.caFile, &cert), "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("new certificate = %d %s", code, body)
	}
	if code, _ := call(t, httpClient(t, w.caFile, &w.nodeX.cert), "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 401 {
		t.Fatalf("superseded certificate = %d, want 401", code)
	}
	at, err := w.st.CredentialRevokedAt(context.Background(), w.nodeX.serial)
	if err != nil || at == nil || at.After(time.Now()) {
		t.Fatalf("old serial revoked_at = %v %v", at, err)
	}
	rows := w.audits("node.renew", w.nodeX.ID)
	if len(rows) != 1 || !strings.Contains(string(rows[0].Details), w.nodeX.serial) || rows[0].Actor != "node:"+w.nodeX.ID+" (cert:"+w.nodeX.serial+")" {
		t.Fatalf("audit = %+v", rows)
	}
}

// With the production grace the superseded certificate keeps working for requests in flight
// (and a retried renewal whose answer was lost) and is scheduled to end in ten minutes.
func TestRenewalGraceKeepsTheOldCertificateBriefly(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{})
	w.populate()
	_, pubPEM := enrollKey(t)
	before := time.Now()
	if code, body := call(t, w.nodeX.client, "POST", w.srv.URL+"/api/v1/agent/renew", "", apiv1.EnrollRequest{PublicKeyPEM: pubPEM}); code != 201 {
		t.Fatalf("renew = %d %s", code, body)
	}
	hb := apiv1.Heartbeat{AgentVersion: "t", Runtime: "sim"}
	if code, body := call(t, httpClient(t, w.caFile, &w.nodeX.cert), "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("old certificate within the grace = %d %s", code, body)
	}
	at, err := w.st.CredentialRevokedAt(context.Background(), w.nodeX.serial)
	if err != nil || at == nil || at.Before(before.Add(9*time.Minute)) || at.After(time.Now().Add(11*time.Minute)) {
		t.Fatalf("old serial ends at %v (%v), want in ~10 minutes", at, err)
	}
}
