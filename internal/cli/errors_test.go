package cli

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

func apiErr(status int, code, msg string, details map[string]any) http.HandlerFunc {
	return reply(status, apiv1.Error{Code: code, Message: msg, Details: details})
}

func TestAPIErrorsMapToExitCodes(t *testing.T) {
	t.Parallel()
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"POST /api/v1/allocations": apiErr(409, apiv1.CodeSKUUnavailable, "no placement for 8 GPUs of h200-sxm-slice",
			map[string]any{"reason": apiv1.ReasonTopologyFragmented}),
		"GET /api/v1/admin/nodes":    apiErr(403, apiv1.CodeForbidden, "admin role required", nil),
		"GET /api/v1/whoami":         apiErr(401, apiv1.CodeUnauthorized, "invalid or expired token", nil),
		"POST /api/v1/admin/tenants": apiErr(409, apiv1.CodeConflict, "tenant acme exists", nil),
		"POST /api/v1/admin/tokens":  apiErr(400, apiv1.CodeInvalidRequest, "ttl must be a positive Go duration", nil),
		"GET /api/v1/skus":           apiErr(503, apiv1.CodeUnavailable, "database unavailable", nil),
		"GET /api/v1/capacity":       apiErr(500, apiv1.CodeInternal, "internal error", nil),
		"POST /api/v1/allocations/01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f51/release": apiErr(409, apiv1.CodeIdempotencyReused, "key reused", nil),
		"GET /api/v1/admin/os-images": func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(502)
			_, _ = io.WriteString(w, "<html>proxy</html>")
		},
		"POST /api/v1/admin/nodes/n1/undrain":                          apiErr(404, apiv1.CodeNotFound, "node n1 not found", nil),
		"PUT /api/v1/admin/nodes/n1/slots":                             apiErr(413, apiv1.CodeTooLarge, "body too large", nil),
		"GET /api/v1/admin/nodes/ghost/slots":                          apiErr(404, apiv1.CodeNotFound, "node ghost not found", nil),
		"GET /api/v1/allocations/01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f52": apiErr(404, apiv1.CodeNotFound, "allocation not found", nil),
	})
	env := fa.env(t)
	slotMap := filepath.Join(t.TempDir(), "m.yaml")
	_ = os.WriteFile(slotMap, []byte("- slot_index: 0\n"), 0o644)

	cases := []struct {
		args   []string
		code   int
		stderr []string
	}{
		{[]string{"alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "8"}, cmdutil.ExitSKUUnavailable,
			[]string{"error: no placement for 8 GPUs of h200-sxm-slice (sku_unavailable)", "reason: topology_fragmented", "hint: 'gpuaasctl alloc explain"}},
		{[]string{"nodes", "list"}, cmdutil.ExitAuth, []string{"admin role required", "hint: this needs an admin token"}},
		{[]string{"whoami"}, cmdutil.ExitAuth, []string{"invalid or expired token", "hint: check --token", "came from GPUAAS_TOKEN"}},
		{[]string{"tenants", "create", "acme"}, cmdutil.ExitConflict, []string{"tenant acme exists (conflict)"}},
		{[]string{"alloc", "release", "01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f51", "--yes"}, cmdutil.ExitConflict, []string{"idempotency_key_reused", "use a new key"}},
		{[]string{"tokens", "create", "--name", "x", "--role", "admin"}, cmdutil.ExitUsage, []string{"invalid_request"}},
		{[]string{"skus", "list"}, cmdutil.ExitUnavailable, []string{"database unavailable", "retry"}},
		{[]string{"capacity"}, cmdutil.ExitError, []string{"internal error"}},
		{[]string{"images", "list"}, cmdutil.ExitUnavailable, []string{"HTTP 502", "proxy"}},
		{[]string{"nodes", "undrain", "n1"}, cmdutil.ExitNotFound, []string{"node n1 not found"}},
		{[]string{"slots", "list", "ghost"}, cmdutil.ExitNotFound, []string{"node ghost not found"}},
		{[]string{"slots", "apply", "n1", "-f", slotMap}, cmdutil.ExitUsage, []string{"payload_too_large"}},
		{[]string{"alloc", "show", "01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f52"}, cmdutil.ExitNotFound, []string{"allocation not found"}},
	}
	for _, c := range cases {
		r := run(t, env, c.args...)
		if r.Code != c.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", c.args, r.Code, c.code, r.ErrOut)
		}
		for _, s := range c.stderr {
			if !strings.Contains(r.ErrOut, s) {
				t.Errorf("%v: stderr %q lacks %q", c.args, r.ErrOut, s)
			}
		}
		if strings.Contains(r.ErrOut, "Usage:") {
			t.Errorf("%v: an API error must not print usage: %q", c.args, r.ErrOut)
		}
		if r.Out != "" {
			t.Errorf("%v: nothing belongs on stdout after an error: %q", c.args, r.Out)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	fa := newFakeAPI(t, nil)
	env := fa.env(t)
	for _, args := range [][]string{
		{"alloc", "show"},
		{"alloc", "show", "a", "b"},
		{"alloc", "list", "--bogus"},
		{"alloc", "list", "-o", "xml"},
		{"alloc", "create", "--sku", "s"},
		{"alloc", "create", "--sku", "s", "--gpus", "many"},
		{"alloc", "bogus"},
		{"bogus"},
		{"slots", "disable", "n1", "minus-one"},
		{"nodes", "add", "n1"},
	} {
		r := run(t, env, args...)
		if r.Code != cmdutil.ExitUsage || !strings.HasPrefix(r.ErrOut, "error: ") || !strings.Contains(r.ErrOut, "Usage:") {
			t.Errorf("%v: exit %d, stderr %q; want 2 with usage", args, r.Code, r.ErrOut)
		}
	}
	if n := len(fa.requests()); n != 0 {
		t.Fatalf("usage errors must not reach the controller: %d requests", n)
	}
	// Without a subcommand a group shows its help and succeeds.
	if r := run(t, env, "alloc"); r.Code != 0 || !strings.Contains(r.Out, "Available Commands") {
		t.Fatalf("alloc: %d %q", r.Code, r.Out)
	}
}

func TestConnectionErrors(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + l.Addr().String()
	l.Close()
	home := t.TempDir()

	r := run(t, map[string]string{"HOME": home, "GPUAAS_SERVER": closed, "GPUAAS_TOKEN": "t"}, "whoami")
	if r.Code != cmdutil.ExitUnavailable || !strings.Contains(r.ErrOut, "cannot reach controller at "+closed) ||
		!strings.Contains(r.ErrOut, "hint: is the controller running at "+closed) {
		t.Fatalf("unreachable: %d %q", r.Code, r.ErrOut)
	}
	r = run(t, map[string]string{"HOME": home, "GPUAAS_SERVER": closed, "GPUAAS_TOKEN": "t"}, "alloc", "create", "--sku", "s", "--gpus", "1", "--idempotency-key", "k-77")
	if r.Code != cmdutil.ExitUnavailable || !strings.Contains(r.ErrOut, "--idempotency-key k-77") {
		t.Fatalf("create unreachable should tell how to retry safely: %d %q", r.Code, r.ErrOut)
	}

	fa := newFakeAPI(t, nil)
	r = run(t, map[string]string{"HOME": home, "GPUAAS_SERVER": fa.URL, "GPUAAS_TOKEN": "t"}, "whoami")
	if r.Code != cmdutil.ExitUnavailable || !strings.Contains(r.ErrOut, "--ca-file") {
		t.Fatalf("untrusted certificate: %d %q", r.Code, r.ErrOut)
	}

	r = run(t, map[string]string{"HOME": home, "GPUAAS_SERVER": "http://127.0.0.1:8443", "GPUAAS_TOKEN": "t"}, "whoami")
	if r.Code != cmdutil.ExitError || !strings.Contains(r.ErrOut, "https://") || strings.Contains(r.ErrOut, "Usage:") {
		t.Fatalf("plain http: %d %q", r.Code, r.ErrOut)
	}
	r = run(t, map[string]string{"HOME": home, "GPUAAS_TOKEN": "t"}, "whoami")
	if r.Code != cmdutil.ExitError || !strings.Contains(r.ErrOut, "GPUAAS_SERVER") {
		t.Fatalf("no server: %d %q", r.Code, r.ErrOut)
	}
	r = run(t, map[string]string{"HOME": home, "GPUAAS_SERVER": fa.URL, "GPUAAS_CA_FILE": fa.CAFile}, "whoami")
	if r.Code != cmdutil.ExitAuth || !strings.Contains(r.ErrOut, "no API token") {
		t.Fatalf("no token: %d %q", r.Code, r.ErrOut)
	}
	if len(fa.requests()) != 0 {
		t.Fatal("a request was sent without trust or a token")
	}
}

// TestConfigPrecedence checks flags > environment > config file through the whole CLI: each
// lower layer points at a closed port, so only the winning layer can reach the fake API.
func TestConfigPrecedence(t *testing.T) {
	t.Parallel()
	fa := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/whoami": reply(200, apiv1.Whoami{Name: "ops", Role: "admin"})})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "https://" + l.Addr().String()
	l.Close()

	home := t.TempDir()
	cfgDir := filepath.Join(home, ".config", "gpuaas")
	if err := os.MkdirAll(cfgDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeConfig := func(server, token string) {
		t.Helper()
		cfg := "server: " + server + "\nca_file: " + fa.CAFile + "\ntoken: " + token + "\n"
		if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("from-token-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth := func() string { return fa.last(t).Header.Get("Authorization") }

	// File only.
	writeConfig(fa.URL, "file-token")
	if r := run(t, map[string]string{"HOME": home}, "whoami"); r.Code != 0 || auth() != "Bearer file-token" {
		t.Fatalf("file: %d %q %q", r.Code, r.ErrOut, auth())
	}
	// Environment over file.
	writeConfig(dead, "file-token")
	env := map[string]string{"HOME": home, "GPUAAS_SERVER": fa.URL, "GPUAAS_TOKEN_FILE": tokenFile}
	if r := run(t, env, "whoami"); r.Code != 0 || auth() != "Bearer from-token-file" {
		t.Fatalf("env over file: %d %q %q", r.Code, r.ErrOut, auth())
	}
	// Flags over environment.
	env = map[string]string{"HOME": home, "GPUAAS_SERVER": dead, "GPUAAS_TOKEN": "env-token"}
	if r := run(t, env, "whoami", "--server", fa.URL, "--token", "flag-token"); r.Code != 0 || auth() != "Bearer flag-token" {
		t.Fatalf("flag over env: %d %q %q", r.Code, r.ErrOut, auth())
	}
	if r := run(t, env, "--server", fa.URL, "--token-file", tokenFile, "whoami", "-o", "json"); r.Code != 0 || auth() != "Bearer from-token-file" || !strings.Contains(r.Out, `"role": "admin"`) {
		t.Fatalf("--token-file over env token: %d %q %q", r.Code, r.ErrOut, auth())
	}
}
