package labhost

import (
	"strings"
	"testing"
)

// The default lab host: an IOMMU a guest can use VFIO behind, one expander bus per NUMA node
// bound to its node, per node a GPU stand-in, a slot disk and a fabric stand-in with SR-IOV
// VFs, each behind a root port of its own, plus the shared-group GPU behind a PCI bridge.
func TestLayoutArgs(t *testing.T) {
	l := DefaultLayout()
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	args := l.Args(Image{RootFS: "/c/rootfs.img", Kernel: "/c/vmlinuz", Initrd: "/c/initrd.img"}, "/r/root.qcow2", "/r", "/r/share", 2222, false)
	line := strings.Join(args, " ")
	count := func(s string) int { return strings.Count(line, s) }
	for _, want := range []string{
		"intel-iommu,intremap=on,caching-mode=on",
		"q35,kernel-irqchip=split", "-accel tcg", "-cpu max",
		"pxb-pcie,id=pxb0,bus_nr=32,numa_node=0,bus=pcie.0",
		"pxb-pcie,id=pxb1,bus_nr=64,numa_node=1,bus=pcie.0",
		"node,nodeid=0,cpus=0-1,memdev=mem0", "node,nodeid=1,cpus=2-3,memdev=mem1",
		"intel_iommu=on iommu=pt", "hugepagesz=1G hugepages=2",
		"hostfwd=tcp:127.0.0.1:2222-:22", "mount_tag=gpuaas",
		"nvme,serial=GPUAASLAB00,drive=disk00", "nvme,serial=GPUAASLAB10,drive=disk10",
		"nvme,serial=GPUAASFAB1,subsys=fabsub1", "sriov_max_vfs=2,sriov_vq_flexible=4,sriov_vi_flexible=2",
		"pcie-pci-bridge,id=sharedbr", "bochs-display,bus=sharedbr,addr=1", "pci-testdev,bus=sharedbr,addr=2",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("QEMU arguments lack %q", want)
		}
	}
	if n := count("-device bochs-display"); n != 3 {
		t.Errorf("%d GPU stand-ins, want 2 + the shared-group one", n)
	}
	// Every PCIe device of a node has a root port of its own (its own IOMMU group): the GPU,
	// the disk and the fabric stand-in per node, and the shared bridge.
	if n := count("-device pcie-root-port"); n != 7 {
		t.Errorf("%d root ports, want 7", n)
	}
	if kvm := strings.Join(l.Args(Image{}, "/o", "/r", "/s", 1, true), " "); !strings.Contains(kvm, "-accel kvm") || !strings.Contains(kvm, "-cpu host") {
		t.Error("with KVM the host runs on KVM with the host CPU model")
	}
	for _, bad := range []Layout{{NUMANodes: 0, CPUsPerNode: 1, MemPerNodeMiB: 1024}, {NUMANodes: 2, CPUsPerNode: 1, MemPerNodeMiB: 256},
		{NUMANodes: 1, CPUsPerNode: 1, MemPerNodeMiB: 1024, GPUsPerNode: 40}, {NUMANodes: 1, CPUsPerNode: 1, MemPerNodeMiB: 1024, DisksPerNode: 1, DiskMiB: 1}} {
		if bad.Validate() == nil {
			t.Errorf("layout %+v accepted", bad)
		}
	}
}
