package labhost

import (
	"fmt"
	"path/filepath"
	"strconv"
)

// PCI ids of the emulated devices, and what each stands in for. hostd recognises the
// stand-ins only in lab-host mode (topology.LabStandIns), never in production.
const (
	// GPUStandInID is QEMU's bochs-display (a display controller with its own kernel driver,
	// bochs): it stands in for a GPU on its native driver, rebound to vfio-pci.
	GPUStandInID = "1234:1111"
	// NVMeID is QEMU's NVMe controller: the slot disks, and (with SR-IOV VFs and no
	// namespace) the fabric NIC stand-in whose VFs stand in for the NIC's VFs.
	NVMeID = "1b36:0010"
)

// Layout is the host's emulated hardware. Every PCIe device sits behind its own root port
// on an expander bus (pxb-pcie) bound to its NUMA node, so the guest kernel sees the
// device's numa_node and an IOMMU group of its own, as on a real server.
type Layout struct {
	NUMANodes     int // NUMA nodes, each with its own CPUs, memory and expander bus
	CPUsPerNode   int // vCPUs per node (the first is the node's housekeeping core)
	MemPerNodeMiB int
	GPUsPerNode   int // GPU stand-ins per node
	DisksPerNode  int // NVMe slot disks per node
	DiskMiB       int
	VFsPerNode    int // SR-IOV VFs of the node's fabric stand-in
	// SharedGroupGPU adds one more GPU stand-in behind a PCIe-to-PCI bridge together with
	// another device: an IOMMU group shared with a device that is not in the slot (discovery
	// must refuse that slot).
	SharedGroupGPU bool
}

// DefaultLayout is the lab host `make lab-host` boots: 2 NUMA nodes x (1 GPU stand-in, 1 NVMe
// slot disk, 1 fabric stand-in with 2 VFs, 2 vCPUs: the node's housekeeping core and the
// slot's; 3 GiB, 1 GiB of it in a 1 GiB hugepage), plus a GPU stand-in in a shared IOMMU
// group. One slot per node: every vCPU of the host is an emulated CPU on this machine's two
// cores, and a host of 6 of them did not finish booting here.
func DefaultLayout() Layout {
	return Layout{NUMANodes: 2, CPUsPerNode: 2, MemPerNodeMiB: 3072, GPUsPerNode: 1, DisksPerNode: 1, DiskMiB: 512, VFsPerNode: 2, SharedGroupGPU: true}
}

// Validate refuses layouts QEMU or the slot model cannot express.
func (l Layout) Validate() error {
	switch {
	case l.NUMANodes < 1 || l.NUMANodes > 4:
		return fmt.Errorf("labhost: %d NUMA nodes (1..4)", l.NUMANodes)
	case l.CPUsPerNode < 1 || l.MemPerNodeMiB < 512:
		return fmt.Errorf("labhost: each node needs a CPU and at least 512 MiB")
	case l.GPUsPerNode < 0 || l.DisksPerNode < 0 || l.VFsPerNode < 0 || l.GPUsPerNode+l.DisksPerNode+2 > 30:
		return fmt.Errorf("labhost: too many devices per node")
	case l.DisksPerNode > 0 && l.DiskMiB < 16:
		return fmt.Errorf("labhost: disks of %d MiB", l.DiskMiB)
	}
	return nil
}

// DiskFile is the backing file of node n's slot disk i in dir.
func DiskFile(dir string, n, i int) string {
	return filepath.Join(dir, fmt.Sprintf("nvme-n%d-d%d.raw", n, i))
}

// DiskSerial is the serial number node n's slot disk i reports in Identify Controller.
func DiskSerial(n, i int) string { return fmt.Sprintf("GPUAASLAB%d%d", n, i) }

// Args is QEMU's command line for a host booted from img with this layout: dir holds the
// run's files (overlay, disks, console log), share is the directory the guest mounts at
// /gpuaas, sshPort is the loopback port forwarded to the guest's sshd.
func (l Layout) Args(img Image, overlay, dir, share string, sshPort int, kvm bool) []string {
	cpus := l.NUMANodes * l.CPUsPerNode
	accel, cpu := "tcg", "max"
	if kvm {
		accel, cpu = "kvm", "host"
	}
	a := []string{
		"-name", "gpuaas-labhost", "-nodefaults", "-no-user-config", "-no-reboot",
		"-machine", "q35,kernel-irqchip=split", "-accel", accel, "-cpu", cpu,
		"-smp", fmt.Sprintf("%d,sockets=%d,cores=%d,threads=1", cpus, l.NUMANodes, l.CPUsPerNode),
		"-m", fmt.Sprintf("%dM", l.NUMANodes*l.MemPerNodeMiB),
		// caching-mode lets the guest use VFIO behind the emulated IOMMU; interrupt
		// remapping needs the split irqchip.
		"-device", "intel-iommu,intremap=on,caching-mode=on",
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		// no_timer_check, nowatchdog and no RCU stall reports: a software-emulated CPU on a busy
		// machine stalls for seconds, which the kernel would otherwise take for broken hardware.
		"-append", "root=/dev/vda rw console=ttyS0 intel_iommu=on iommu=pt init=/sbin/gpuaas-labhost-init net.ifnames=0 panic=-1 " +
			"nowatchdog no_timer_check rcupdate.rcu_cpu_stall_suppress=1 hugepagesz=1G hugepages=" + strconv.Itoa(l.NUMANodes) + " quiet",
		"-drive", "if=none,id=root,format=qcow2,file=" + overlay,
		"-device", "virtio-blk-pci,drive=root,bus=pcie.0",
		"-netdev", fmt.Sprintf("user,id=net0,hostfwd=tcp:127.0.0.1:%d-:22", sshPort),
		"-device", "virtio-net-pci,netdev=net0,bus=pcie.0",
		"-virtfs", "local,path=" + share + ",mount_tag=gpuaas,security_model=none,id=share",
		"-display", "none", "-serial", "file:" + filepath.Join(dir, "console.log"), "-monitor", "none",
	}
	chassis := 1
	port := func(bus string) string {
		id := "rp" + strconv.Itoa(chassis)
		a = append(a, "-device", fmt.Sprintf("pcie-root-port,id=%s,bus=%s,chassis=%d,slot=0", id, bus, chassis))
		chassis++
		return id
	}
	for n := 0; n < l.NUMANodes; n++ {
		first, last := n*l.CPUsPerNode, (n+1)*l.CPUsPerNode-1
		a = append(a, "-object", fmt.Sprintf("memory-backend-ram,id=mem%d,size=%dM", n, l.MemPerNodeMiB),
			"-numa", fmt.Sprintf("node,nodeid=%d,cpus=%d-%d,memdev=mem%d", n, first, last, n))
	}
	for n := 0; n < l.NUMANodes; n++ {
		pxb := "pxb" + strconv.Itoa(n)
		a = append(a, "-device", fmt.Sprintf("pxb-pcie,id=%s,bus_nr=%d,numa_node=%d,bus=pcie.0", pxb, 0x20*(n+1), n))
		for g := 0; g < l.GPUsPerNode; g++ {
			a = append(a, "-device", "bochs-display,bus="+port(pxb))
		}
		for d := 0; d < l.DisksPerNode; d++ {
			id := fmt.Sprintf("disk%d%d", n, d)
			a = append(a, "-drive", fmt.Sprintf("if=none,id=%s,format=raw,cache=none,aio=native,file=%s", id, DiskFile(dir, n, d)),
				"-device", fmt.Sprintf("nvme,serial=%s,drive=%s,bus=%s", DiskSerial(n, d), id, port(pxb)))
		}
		if l.VFsPerNode > 0 {
			// The fabric stand-in: an NVMe controller in a subsystem of its own, with flexible
			// queue and interrupt resources for its VFs, and no namespace.
			sub := fmt.Sprintf("fabsub%d", n)
			vfs := l.VFsPerNode
			a = append(a, "-device", "nvme-subsys,id="+sub+",nqn=gpuaas-lab-fabric-"+strconv.Itoa(n),
				"-device", fmt.Sprintf("nvme,serial=GPUAASFAB%d,subsys=%s,bus=%s,sriov_max_vfs=%d,sriov_vq_flexible=%d,sriov_vi_flexible=%d,max_ioqpairs=%d,msix_qsize=%d",
					n, sub, port(pxb), vfs, 2*vfs, vfs, 2*vfs+2, vfs+2))
		}
	}
	if l.SharedGroupGPU {
		// Conventional PCI behind a PCIe-to-PCI bridge: no ACS, one IOMMU group for the bridge
		// and everything behind it. On the main root complex (no NUMA node), so it takes no
		// node's CPUs from the slots approval plans for the nodes' GPUs.
		a = append(a, "-device", "pcie-pci-bridge,id=sharedbr,bus="+port("pcie.0"),
			"-device", "bochs-display,bus=sharedbr,addr=1", "-device", "pci-testdev,bus=sharedbr,addr=2")
	}
	return a
}
