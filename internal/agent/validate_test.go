package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
)

// The host refuses to validate a slot it sees in use, whatever the controller believed: a
// process holding the VFIO group of the slot's GPU open (a running VM's QEMU), or a live
// slice's lease on the slot. A free slot is validated. The host tree is the real H200 GPU's
// sysfs attributes under a fixture root, with the IOMMU group link and /proc added.
func TestHostRefusesToValidateASlotInUse(t *testing.T) {
	root := t.TempDir()
	const gpu = "0000:1b:00.0"
	dev := filepath.Join(root, "sys/bus/pci/devices", gpu)
	if err := os.CopyFS(dev, os.DirFS("../health/testdata/h200-sysfs-gpu")); err != nil {
		t.Fatal(err)
	}
	link := func(target, name string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	link("../../../kernel/iommu_groups/7", filepath.Join(dev, "iommu_group"))
	// Another process holds another group: that is not this slot's business.
	link("/dev/vfio/9", filepath.Join(root, "proc/311/fd/4"))

	leaseDir := &leases.Dir{Path: filepath.Join(t.TempDir(), "leases"), TTL: time.Minute}
	a := &Agent{host: hostfs.New(root), runtime: slicevm.Sim{}}
	p := &task.SlotValidate{SlotID: "slot-1", Level: "quick", GPUPCI: gpu}

	res, err := a.validateSlot(context.Background(), p, leaseDir, &slicevm.Recorder{})
	if err != nil || !res.Passed || !res.Simulated {
		t.Fatalf("a free slot: %+v, %v", res, err)
	}

	link("/dev/vfio/7", filepath.Join(root, "proc/4242/fd/17"))
	if err := os.WriteFile(filepath.Join(root, "proc/4242/comm"), []byte("qemu-system-x86\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = a.validateSlot(context.Background(), p, leaseDir, &slicevm.Recorder{})
	if err == nil || !strings.Contains(err.Error(), gpu+": VFIO group 7 open in pid 4242 (qemu-system-x86)") {
		t.Fatalf("a slot whose GPU a VM holds was validated: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(root, "proc/4242")); err != nil {
		t.Fatal(err)
	}

	own := &leases.Dir{Path: leaseDir.Path, TTL: time.Minute} // provisioning's own handle
	if _, err := own.Acquire(leases.Request{AllocationID: "a-live", TaskID: "t1", Slots: map[string][]string{"slot-1": {gpu, "", "/dev/disk/by-id/nvme-x"}}}); err != nil {
		t.Fatal(err)
	}
	_, err = a.validateSlot(context.Background(), p, leaseDir, &slicevm.Recorder{})
	if err == nil || !strings.Contains(err.Error(), "allocation a-live holds a live lease on the slot") {
		t.Fatalf("a slot a live slice leases was validated: %v", err)
	}
	if _, err := own.Release("a-live", []string{"slot-1"}); err != nil {
		t.Fatal(err)
	}
	if res, err = a.validateSlot(context.Background(), p, leaseDir, &slicevm.Recorder{}); err != nil || !res.Passed {
		t.Fatalf("the slot after the slice's release: %+v, %v", res, err)
	}
}
