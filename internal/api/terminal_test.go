package api_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// termWorld is an active allocation of tenant A on a node, tokens for A, B and an admin.
type termWorld struct {
	srv               *httptest.Server
	st                *store.Store
	svc               *alloc.Service
	alloc             string
	admin, tenA, tenB string
	caFile            string
}

func termSetup(t *testing.T, maxPerTenant int) *termWorld {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, pgtest.NewDatabase(t), store.Options{AllowUntestedImages: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	w := &termWorld{st: st, admin: "gpa_term_admin", tenA: "gpa_term_tenant_a", tenB: "gpa_term_tenant_b"}
	var tenA string
	err = st.InTx(ctx, func(tx *store.Tx) error {
		a, err := tx.CreateTenant(ctx, "a")
		if err != nil {
			return err
		}
		b, err := tx.CreateTenant(ctx, "b")
		if err != nil {
			return err
		}
		tenA = a.ID
		for _, tk := range []struct{ name, tok, role, tenant string }{{"admin", w.admin, "admin", ""}, {"a", w.tenA, "tenant", a.ID}, {"b", w.tenB, "tenant", b.ID}} {
			if _, err := tx.CreateToken(ctx, tk.name, pki.HashToken(tk.tok), tk.role, tk.tenant, nil); err != nil {
				return err
			}
		}
		if _, err := tx.CreateImage(ctx, apiv1.OSImage{Slug: "img", DisplayName: "i", Version: "1", Target: "vm_slice", Family: "debian",
			Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://x/i", DigestSHA256: strings.Repeat("ab", 32),
			DefaultUsername: "debian", DriverStrategy: "none", Active: true}); err != nil {
			return err
		}
		n, err := tx.CreateNode(ctx, apiv1.NodeCreate{Name: "n1", Region: "lab", SliceSKU: "h200-sxm-slice"})
		if err != nil {
			return err
		}
		_, err = tx.ApplySlots(ctx, n.ID, fixtures.H200SlotMap(1), false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := pki.Init(pki.InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w.svc = alloc.New(st, alloc.Config{})
	d := dispatch.New(st, w.svc, key, nil, dispatch.Config{})
	apiSrv := api.New(api.Options{Store: st, Alloc: w.svc, Dispatch: d, Terminal: api.TerminalConfig{MaxPerTenant: maxPerTenant}})
	w.srv = httptest.NewUnstartedServer(apiSrv.Handler())
	if w.srv.TLS, err = pki.ServerTLSConfig(dir); err != nil {
		t.Fatal(err)
	}
	w.srv.StartTLS()
	t.Cleanup(w.srv.Close)
	w.caFile = pki.Paths{Dir: dir}.CACert()
	a, _, err := w.svc.Create(ctx, alloc.Actor{Role: "tenant", TenantID: tenA}, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, "")
	if err != nil {
		t.Fatal(err)
	}
	w.alloc = a.ID
	if err := w.svc.MarkProvisioning(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.svc.MarkActive(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *termWorld) client(t *testing.T, tok string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{Server: w.srv.URL, CAFile: w.caFile, Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func code(err error) string {
	if e, ok := err.(*apiv1.Error); ok {
		return e.Code
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return "ok"
}

func TestTerminalAuthorizationMatrix(t *testing.T) {
	w := termSetup(t, 8)
	ctx := context.Background()
	term := apiv1.TerminalRequest{Mode: "terminal"}
	cases := []struct {
		who  string
		tok  string
		req  apiv1.TerminalRequest
		want string
	}{
		{"the allocation's tenant", w.tenA, term, "ok"},
		{"another tenant", w.tenB, term, apiv1.CodeNotFound},
		{"an admin", w.admin, term, "ok"},
		{"the tenant, stdio", w.tenA, apiv1.TerminalRequest{Mode: "stdio"}, "ok"},
		{"the tenant, console", w.tenA, apiv1.TerminalRequest{Mode: "console"}, apiv1.CodeForbidden},
		{"an admin, console", w.admin, apiv1.TerminalRequest{Mode: "console"}, "ok"},
		{"a bad mode", w.tenA, apiv1.TerminalRequest{Mode: "vnc"}, apiv1.CodeInvalidRequest},
		{"a command in stdio mode", w.tenA, apiv1.TerminalRequest{Mode: "stdio", Command: "id"}, apiv1.CodeInvalidRequest},
		{"no token", "", term, apiv1.CodeUnauthorized},
	}
	for _, c := range cases {
		_, err := w.client(t, c.tok).OpenTerminal(ctx, w.alloc, c.req)
		if got := code(err); got != c.want {
			t.Errorf("%s: %s, want %s", c.who, got, c.want)
		}
	}
	// An admin entering a tenant's VM is audited as such.
	entries, err := w.st.ListAudit(ctx, store.AuditFilter{Action: "terminal.open", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	admins := 0
	for _, e := range entries {
		if strings.Contains(string(e.Details), `"as_admin":true`) || strings.Contains(string(e.Details), `"as_admin": true`) {
			admins++
		}
	}
	if admins != 2 {
		t.Fatalf("%d terminal.open audits marked as_admin, want 2: %+v", admins, entries)
	}
	// Released: refused.
	if _, err := w.svc.Release(ctx, alloc.Actor{Role: "admin"}, w.alloc); err != nil {
		t.Fatal(err)
	}
	if _, err := w.client(t, w.tenA).OpenTerminal(ctx, w.alloc, term); code(err) != apiv1.CodeConflict {
		t.Fatalf("released allocation: %v", err)
	}
}

func TestTerminalTicketIsSingleUseAndBound(t *testing.T) {
	w := termSetup(t, 8)
	ctx := context.Background()
	a := w.client(t, w.tenA)
	tk, err := a.OpenTerminal(ctx, w.alloc, apiv1.TerminalRequest{Mode: "terminal"})
	if err != nil {
		t.Fatal(err)
	}
	// Someone else's bearer token with this ticket: refused (and the ticket is not spent).
	if _, err := w.client(t, w.admin).Attach(ctx, tk); code(err) != apiv1.CodeUnauthorized {
		t.Fatalf("ticket with another user's token: %v", err)
	}
	forged := *tk
	forged.Token = "gts_forged"
	if _, err := a.Attach(ctx, &forged); code(err) != apiv1.CodeUnauthorized {
		t.Fatalf("forged ticket: %v", err)
	}
	conn, err := a.Attach(ctx, tk)
	if err != nil {
		t.Fatalf("first use: %v", err)
	}
	defer conn.Close()
	if _, err := a.Attach(ctx, tk); code(err) != apiv1.CodeUnauthorized {
		t.Fatalf("second use: %v", err)
	}
	// The client is attached and waiting for the host; the session is listed as the tenant's.
	ss, err := a.ListSessions(ctx, "")
	if err != nil || len(ss) != 1 || ss[0].ID != tk.SessionID || ss[0].Mode != "terminal" {
		t.Fatalf("sessions %+v %v", ss, err)
	}
	if ss, _ := w.client(t, w.tenB).ListSessions(ctx, ""); len(ss) != 0 {
		t.Fatalf("another tenant sees %d sessions", len(ss))
	}
	if _, err := w.client(t, w.tenB).GetSession(ctx, tk.SessionID); code(err) != apiv1.CodeNotFound {
		t.Fatalf("another tenant's session: %v", err)
	}
}

func TestTerminalPerTenantLimit(t *testing.T) {
	w := termSetup(t, 2)
	ctx := context.Background()
	a := w.client(t, w.tenA)
	for i := 0; i < 2; i++ {
		if _, err := a.OpenTerminal(ctx, w.alloc, apiv1.TerminalRequest{Mode: "stdio"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := a.OpenTerminal(ctx, w.alloc, apiv1.TerminalRequest{Mode: "stdio"})
	if code(err) != apiv1.CodeConflict || !strings.Contains(err.Error(), "limit 2") {
		t.Fatalf("third session: %v", err)
	}
}
