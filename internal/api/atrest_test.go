package api_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// No secret handed to a matrixCaller is stored in the clear: a pg_dump of the whole database
// holds the SHA-256 of every API token, bootstrap token and terminal client token, and
// none of the tokens themselves.
func TestTokensAreHashedAtRest(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{})
	w.populate()
	var fresh apiv1.BootstrapToken
	w.must("POST", "/api/v1/admin/nodes/"+w.nodeZ.ID+"/bootstrap-token", w.admin, nil, 201, &fresh)
	active := w.activeAllocation()
	var ticket apiv1.TerminalTicket
	w.must("POST", "/api/v1/allocations/"+active+"/terminal", w.tenA, apiv1.TerminalRequest{Mode: "terminal"}, 201, &ticket)

	secrets := map[string]string{
		"admin token": w.admin, "tenant A token": w.tenA, "tenant B token": w.tenB, "revoked token": w.revoked,
		"expired token": w.expired, "node X bootstrap token (used)": w.nodeX.BootstrapToken,
		"node Z bootstrap token (unused)": w.nodeZ.BootstrapToken, "node Z second bootstrap token": fresh.Token,
		"terminal client token": ticket.Token,
	}
	bin, err := pgserver.FindBinDir()
	if err != nil {
		t.Skip("pg_dump not found:", err)
	}
	out, err := exec.Command(filepath.Join(bin, "pg_dump"), "--data-only", "--dbname", w.dbURL).CombinedOutput()
	if err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, out)
	}
	dump := string(out)
	if !strings.Contains(dump, "COPY public.api_tokens") || !strings.Contains(dump, "COPY public.node_bootstrap_tokens") {
		t.Fatalf("the dump lacks the token tables:\n%.2000s", dump)
	}
	for what, secret := range secrets {
		if secret == "" {
			t.Fatalf("%s is empty: the world was not built", what)
		}
		if strings.Contains(dump, secret) {
			t.Errorf("the %s is stored in the clear", what)
		}
		if !strings.Contains(dump, pki.HashToken(secret)) {
			t.Errorf("the %s's hash is not in the dump: it is not stored the way the test assumes", what)
		}
	}
}
