package soak

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/bench/provision"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
)

// TestStateDirFull fills a real filesystem (a 1 MiB tmpfs mounted on hostd's state dir)
// and asks for an allocation on that host. hostd starts nothing it could not record: the
// provisioning fails with host_state_unwritable and the disk error, the cleanup release
// fails the same way, and the slot ends cleanup_blocked with that error, never available.
func TestStateDirFull(t *testing.T) {
	pgtest.RequireServer(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs on hostd's state dir")
	}
	if testing.Short() {
		t.Skip("starts a controller and a host (-short)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := binaries(t)
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: workDir(t), BinDir: bin, ExtraFlags: []string{"--task-lease", "5s"}})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	fleet, err := provision.StartWith(ctx, env, bin, provision.Options{Hosts: 1, Prefix: "full", Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Stop()

	state := fleet.StateDir(0)
	if err := fleet.Kill(0); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "gpuaas-soak-full", state).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v %s", err, out)
	}
	t.Cleanup(func() {
		fleet.Stop()
		_ = exec.Command("umount", state).Run()
	})
	if err := fleet.Restart(0); err != nil {
		t.Fatal(err)
	}
	// hostd makes its spool and completed dirs on the empty filesystem at start.
	waitFor(t, time.Minute, "hostd to create its spool on the tmpfs", func() bool {
		_, err := os.Stat(filepath.Join(state, "spool"))
		return err == nil
	})
	fill(t, filepath.Join(state, "filler"))

	tenant, err := env.Client()
	if err != nil {
		t.Fatal(err)
	}
	a, err := tenant.CreateAllocation(ctx, apiv1.AllocationCreate{SKU: benchenv.SliceSKU, GPUs: 1, Image: fleet.Image()}, "")
	if err != nil {
		t.Fatal(err)
	}
	admin := fleet.Admin()
	var got *apiv1.Allocation
	waitFor(t, 2*time.Minute, "the allocation to fail", func() bool {
		got, err = admin.GetAllocation(ctx, a.ID)
		return err == nil && (got.Status == "failed" || got.Status == "active")
	})
	if got.Status != "failed" || !strings.Contains(got.FailureReason, "host_state_unwritable") || !strings.Contains(got.FailureReason, "no space left on device") {
		t.Fatalf("allocation %s (%q), want failed with host_state_unwritable: no space left on device", got.Status, got.FailureReason)
	}
	if len(got.Claims) != 1 || got.Claims[0].SlotIndex == nil {
		t.Fatalf("claims %+v", got.Claims)
	}
	idx := *got.Claims[0].SlotIndex
	var slot apiv1.Slot
	seen := map[string]bool{}
	waitFor(t, 2*time.Minute, "the slot to be cleanup_blocked", func() bool {
		slots, err := admin.ListSlots(ctx, fleet.Name(0))
		if err != nil {
			return false
		}
		for _, s := range slots {
			if s.SlotIndex == idx {
				slot = s
				seen[s.Status] = true
			}
		}
		return slot.Status == "cleanup_blocked"
	})
	if seen["available"] {
		t.Fatalf("slot %d was available while its cleanup could not be proven (states seen %v)", idx, seen)
	}
	if !strings.Contains(slot.StatusReason, "host_state_unwritable") || !strings.Contains(slot.StatusReason, "no space left on device") {
		t.Fatalf("slot %d blocked with %q, want the host's disk error", idx, slot.StatusReason)
	}
	v, err := env.Store.InvariantsWithin(ctx, store.Deadlines{Provision: 5 * time.Minute, Release: 5 * time.Minute})
	if err != nil || len(v) > 0 {
		t.Fatalf("invariants: %v %v", v, err)
	}
	// Nothing else on the host was touched: its other slots are still for sale.
	slots, err := admin.ListSlots(ctx, fleet.Name(0))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if s.SlotIndex != idx && s.Status != "available" {
			t.Errorf("slot %d: %s %s, want available", s.SlotIndex, s.Status, s.StatusReason)
		}
	}
}

// fill writes path until its filesystem is full (ENOSPC), as a runaway log would.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling %s: %v, want ENOSPC", path, err)
	}
}

// waitFor polls cond every 100 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
