package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hypervisor"
)

// hostd keeps guest telemetry tokens in its state dir (telemetry/tokens.json, 0600, in a
// 0700 directory): a VM runtime built again (hostd restarted) knows the token a running
// guest carries.
func TestTelemetryTokensKeptInStateDirAcrossRestart(t *testing.T) {
	if _, err := os.Stat(hypervisor.DefaultSocket); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must start libvirtd (%s missing)", hypervisor.DefaultSocket)
		}
		t.Skipf("libvirtd not running (%s missing)", hypervisor.DefaultSocket)
	}
	dir := t.TempDir()
	cfg := Config{Runtime: "lab", HostRoot: "/", StateDir: filepath.Join(dir, "state"), DataDir: filepath.Join(dir, "data"),
		Bridge: "gpuaas-none", BridgeAddress: "10.100.0.1/24", LibvirtSocket: hypervisor.DefaultSocket}
	build := func() *vmServices {
		t.Helper()
		_, vm, err := newVMRuntime(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = vm.hyper.Close() })
		return vm
	}
	tok, err := build().telemetry.Register("a1")
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{filepath.Join(cfg.StateDir, "telemetry"): 0o700, filepath.Join(cfg.StateDir, "telemetry", "tokens.json"): 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Fatalf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	restarted := build()
	if !restarted.telemetry.Has("a1") {
		t.Fatal("the guest's token is gone after a restart")
	}
	if again, _ := restarted.telemetry.Register("a1"); again != tok {
		t.Fatal("a restarted hostd issued a new token; the running guest has the old one")
	}
}
