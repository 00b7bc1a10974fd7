package api_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

// ctl runs gpuaasctl in-process against the world's controller as the admin.
func (w *secWorld) ctl(args ...string) (int, string, string) {
	w.t.Helper()
	env := map[string]string{"HOME": w.t.TempDir(), "GPUAAS_SERVER": w.srv.URL, "GPUAAS_CA_FILE": w.caFile, "GPUAAS_TOKEN": w.admin}
	var out, errOut bytes.Buffer
	code := cli.Run(context.Background(), args, cmdutil.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
		func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

// gpuaasctl lists tokens without secrets, revokes a token and a node against the real
// controller, and each revocation takes effect at once; revoking a node needs --yes.
func TestCtlListsAndRevokes(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{})
	w.populate()
	var who apiv1.Whoami
	w.must("GET", "/api/v1/whoami", w.tenB, nil, 200, &who)

	code, out, errOut := w.ctl("tokens", "list")
	if code != 0 || !strings.Contains(out, who.TokenID) || !strings.Contains(out, "b-ci") || !strings.Contains(out, "REVOKED") {
		t.Fatalf("tokens list = %d %q %q", code, out, errOut)
	}
	for _, secret := range []string{w.admin, w.tenA, w.tenB} {
		if strings.Contains(out, secret) {
			t.Fatalf("tokens list shows a secret: %s", out)
		}
	}
	if code, out, errOut := w.ctl("tokens", "revoke", who.TokenID, "--yes"); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("tokens revoke = %d %q %q", code, out, errOut)
	}
	if code, _ := w.do("GET", "/api/v1/whoami", w.tenB, nil); code != 401 {
		t.Fatalf("revoked through the CLI, whoami = %d", code)
	}
	if code, _, _ := w.ctl("tokens", "revoke", who.TokenID, "--yes"); code != cmdutil.ExitConflict {
		t.Fatalf("revoking twice exits %d, want %d", code, cmdutil.ExitConflict)
	}

	hb := apiv1.Heartbeat{AgentVersion: "t", Runtime: "sim"}
	if code, _, errOut := w.ctl("nodes", "revoke", "node-x"); code != cmdutil.ExitUsage || !strings.Contains(errOut, "--yes") {
		t.Fatalf("nodes revoke without --yes = %d %q", code, errOut)
	}
	if code, _ := call(t, w.nodeX.client, "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 204 {
		t.Fatalf("node revoked without confirmation: %d", code)
	}
	code, out, errOut = w.ctl("nodes", "revoke", "node-x", "--yes", "-o", "json")
	if code != 0 || !strings.Contains(out, `"revoked_certificates": 1`) {
		t.Fatalf("nodes revoke = %d %q %q", code, out, errOut)
	}
	if code, _ := call(t, w.nodeX.client, "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", hb); code != 401 {
		t.Fatalf("revoked node's heartbeat = %d", code)
	}
}
