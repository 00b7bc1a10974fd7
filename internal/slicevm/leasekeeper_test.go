package slicevm

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/dhcpd"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/imagecache"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/telemetry"
)

// labHost is a lab Host on the real libvirtd (CI starts it; elsewhere the test skips) with
// its state under a temporary directory and leases of the given TTL.
func labHost(t *testing.T, ttl time.Duration) *Host {
	t.Helper()
	if _, err := os.Stat(hypervisor.DefaultSocket); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must start libvirtd (%s missing)", hypervisor.DefaultSocket)
		}
		t.Skipf("libvirtd not running (%s missing)", hypervisor.DefaultSocket)
	}
	hv, err := hypervisor.Connect(hypervisor.DefaultSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hv.Close() })
	data := t.TempDir()
	srv, err := dhcpd.New(dhcpd.Config{Interface: "gpuaas-none", ServerIP: net.IPv4(10, 100, 0, 1), Netmask: net.CIDRMask(24, 32),
		StateFile: filepath.Join(data, "dhcp", "reservations.json"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(HostConfig{Lab: true, DataDir: data, FS: hostfs.New("/"), Run: hostfs.Exec{}, Hypervisor: hv,
		Leases: &leases.Dir{Path: filepath.Join(data, "node-scheduler", "leases"), TTL: ttl},
		Images: &imagecache.Cache{Dir: filepath.Join(data, "slice-images")}, DHCP: srv, Telemetry: telemetry.NewRegistry(),
		Bridge: "gpuaas-none", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func leaseDrift(rep task.ReconcileReport) []string {
	var out []string
	for _, s := range rep.Slots {
		for _, d := range s.Drift {
			if strings.Contains(d, "lease") {
				out = append(out, s.SlotID+": "+d)
			}
		}
	}
	return out
}

// A live slice's node-scheduler leases are renewed for as long as it lives: with a 1 s TTL,
// reconcile never reports "no lease" for it over several TTLs. Leases of an allocation that
// no longer lives here run out; release drops the slice's own leases and nothing renews
// them afterwards.
func TestLiveSliceLeasesAreRenewedAndReleased(t *testing.T) {
	const ttl = time.Second
	h := labHost(t, ttl)
	live := plan()
	live.AllocationID = "a-live"
	req := leases.Request{AllocationID: live.AllocationID, TaskID: "t-live", Slots: map[string][]string{}}
	for _, b := range live.Bundles {
		req.Slots[b.SlotID] = []string{b.GPUPCI, b.FabricVFPCI, b.NVMeDevice}
	}
	if _, err := h.cfg.Leases.Acquire(req); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(h.SliceDir(live.AllocationID), 0o711); err != nil { // what provisioning leaves
		t.Fatal(err)
	}
	// Slot s9 kept its lease at release (its disk failed the wipe): no slice lives for it.
	if _, err := h.cfg.Leases.Acquire(leases.Request{AllocationID: "a-gone", TaskID: "t-gone", Slots: map[string][]string{"s9": {"0000:99:00.0"}}}); err != nil {
		t.Fatal(err)
	}
	acquired := time.Now()

	ctx, cancel := context.WithCancel(context.Background())
	kept := make(chan struct{})
	go func() { h.KeepLeases(ctx); close(kept) }()
	rc := &task.Reconcile{Allocations: []task.ReconcileAllocation{{AllocationID: live.AllocationID, Status: "active", Bundles: live.Bundles}}}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Since(acquired) < 4*ttl {
		rep, err := h.Reconcile(ctx, rc)
		if err != nil {
			t.Fatal(err)
		}
		if d := leaseDrift(rep); len(d) > 0 {
			t.Fatalf("%s after acquiring (TTL %s): lease drift %q", time.Since(acquired).Round(time.Millisecond), ttl, d)
		}
		<-tick.C
	}
	held, err := h.cfg.Leases.Held()
	if err != nil {
		t.Fatal(err)
	}
	var slots []string
	for _, l := range held {
		slots = append(slots, l.AllocationID+"/"+l.SlotID)
	}
	slices.Sort(slots)
	if want := []string{"a-live/s0", "a-live/s1"}; !slices.Equal(slots, want) {
		t.Fatalf("held leases after 4 TTLs: %q, want %q (a-gone's run out)", slots, want)
	}

	// Release drops them, and the keeper does not bring them back.
	rel := &task.VMRelease{AllocationID: live.AllocationID, Bundles: live.Bundles, GracefulTimeoutS: 1}
	out, err := h.Release(ctx, rel, &Recorder{TaskID: "t-release"})
	if err != nil || out.LeasesReleased != 2 {
		t.Fatalf("release: %v (leases released %d)", err, out.LeasesReleased)
	}
	if n, err := h.RenewLeases(); err != nil || n != 0 {
		t.Fatalf("renewed %d leases after release (%v)", n, err)
	}
	if held, _ := h.cfg.Leases.Held(); len(held) != 0 {
		t.Fatalf("leases after release: %+v", held)
	}
	cancel()
	<-kept
}
