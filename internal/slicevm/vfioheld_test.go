package slicevm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/task"
)

// After the domain starts, hostd checks its QEMU process holds the VFIO group of every GPU
// and VF of the slot open: a definition that names a device QEMU never opened is an error
// naming the device and its group.
func TestVFIOGroupsHeldByQEMU(t *testing.T) {
	root := t.TempDir()
	mk := func(p, target string) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "run/libvirt/qemu"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "run/libvirt/qemu/gpuaas-a.pid"), []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mk("sys/bus/pci/devices/0000:21:00.0/iommu_group", "../../../../kernel/iommu_groups/12")
	mk("sys/bus/pci/devices/0000:24:00.2/iommu_group", "../../../../kernel/iommu_groups/17")
	mk("proc/4242/fd/0", "/dev/null")
	mk("proc/4242/fd/31", "/dev/vfio/vfio")
	mk("proc/4242/fd/32", "/dev/vfio/12")
	h := &Host{cfg: HostConfig{FS: hostfs.New(root)}}
	b := []task.Bundle{{GPUPCI: "0000:21:00.0", FabricVFPCI: "0000:24:00.2"}}
	if _, err := h.vfioHeld("gpuaas-a", b); err == nil || !strings.Contains(err.Error(), "0000:24:00.2 (group 17)") {
		t.Fatalf("a VF whose group QEMU does not hold: %v", err)
	}
	mk("proc/4242/fd/33", "/dev/vfio/17")
	got, err := h.vfioHeld("gpuaas-a", b)
	if err != nil || got != "QEMU pid 4242 holds VFIO groups 12, 17" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := h.vfioHeld("gpuaas-b", b); err == nil || !strings.Contains(err.Error(), "no pid file") {
		t.Fatalf("a domain without a QEMU process: %v", err)
	}
}
