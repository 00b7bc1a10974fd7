package prereq

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

func touch(t *testing.T, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadyHostAndEachFailure(t *testing.T) {
	root := t.TempDir()
	touch(t, root, "dev/kvm", "")
	touch(t, root, "proc/cmdline", "BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt")
	touch(t, root, "sys/kernel/iommu_groups/0/devices/.keep", "")
	touch(t, root, "sys/module/vfio_pci/.keep", "")
	touch(t, root, "sys/class/net/ovsbr0/address", "aa:bb:cc:dd:ee:ff")
	touch(t, root, "usr/share/OVMF/OVMF_CODE_4M.fd", "")
	touch(t, root, "usr/bin/qemu-img", "")
	touch(t, root, "sys/devices/system/node/node0/hugepages/hugepages-1048576kB/free_hugepages", "128")
	// A real unix socket answering as libvirtd would (short path: sockets are length-limited).
	sockDir, err := os.MkdirTemp("", "lv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	ln, err := net.Listen("unix", filepath.Join(sockDir, "libvirt-sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_ = os.MkdirAll(filepath.Join(root, "run"), 0o755)
	if err := os.Symlink(sockDir, filepath.Join(root, "run/libvirt")); err != nil {
		t.Fatal(err)
	}

	r := Run(hostfs.New(root), Options{HugepagesGiB: 64})
	if !r.Ready || len(r.Failed) != 0 {
		t.Fatalf("ready host reported %+v", r)
	}
	r = Run(hostfs.New(root), Options{HugepagesGiB: 512})
	if r.Ready || !reflect.DeepEqual(r.Failed, []string{"hugepages_1g"}) {
		t.Fatalf("hugepage shortage: %+v", r.Failed)
	}
	touch(t, root, "var/lib/gpuaas/site-bootstrap/h200-slice-vm.reboot-required", "")
	_ = os.Remove(filepath.Join(root, "dev/kvm"))
	ln.Close()
	r = Run(hostfs.New(root), Options{})
	if !reflect.DeepEqual(r.Failed, []string{"kvm", "libvirt", "reboot_required"}) {
		t.Fatalf("failed = %v", r.Failed)
	}
	for _, c := range r.Checks {
		if !c.OK && c.Remediation == "" {
			t.Fatalf("check %s fails without remediation text", c.Name)
		}
	}
}

// The Firecracker H100 guest of LAB.md: /dev/kvm but no IOMMU, no vfio.
func TestSparseHost(t *testing.T) {
	root := t.TempDir()
	touch(t, root, "dev/kvm", "")
	r := Run(hostfs.New(root), Options{})
	if r.Ready {
		t.Fatal("a host without IOMMU/vfio reported ready")
	}
	for _, want := range []string{"iommu", "vfio_pci", "ovs_bridge", "libvirt", "ovmf", "qemu_img"} {
		found := false
		for _, f := range r.Failed {
			found = found || f == want
		}
		if !found {
			t.Fatalf("%s not failed: %v", want, r.Failed)
		}
	}
}
