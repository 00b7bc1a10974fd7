package topology

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// fuzzTree is one host: a GPU, a fabric parent with one VF link, an NVMe namespace with a
// by-id link and a head, and /proc/mounts, every name, link target and file text fuzzed.
type fuzzTree struct {
	gpuAddr, vendor, class, numa, group, peer string
	vfTarget, byID, mounts, size              string
	head                                      []byte
}

// element is a single path element a filesystem can hold.
func element(s string) bool {
	return s != "" && s != "." && s != ".." && len(s) < 200 && !strings.ContainsAny(s, "/\x00")
}

func (ft fuzzTree) write(root string) bool {
	if !element(ft.gpuAddr) || !element(ft.peer) || !element(ft.byID) || !element(ft.group) ||
		strings.ContainsRune(ft.vfTarget, 0) || ft.vfTarget == "" || len(ft.vfTarget) > 200 || ft.gpuAddr == "0000:1a:00.0" {
		return false
	}
	files := map[string]string{
		"sys/bus/pci/devices/" + ft.gpuAddr + "/vendor":                      ft.vendor,
		"sys/bus/pci/devices/" + ft.gpuAddr + "/class":                       ft.class,
		"sys/bus/pci/devices/" + ft.gpuAddr + "/device":                      "0x2335",
		"sys/bus/pci/devices/" + ft.gpuAddr + "/numa_node":                   ft.numa,
		"sys/bus/pci/devices/0000:1a:00.0/vendor":                            "0x15b3",
		"sys/bus/pci/devices/0000:1a:00.0/numa_node":                         ft.numa,
		"sys/kernel/iommu_groups/" + ft.group + "/devices/" + ft.peer + "/x": "",
		"sys/block/nvme0n1/size":                                             ft.size,
		"sys/bus/pci/devices/0000:2a:00.0/numa_node":                         ft.numa,
		"proc/mounts":                           ft.mounts,
		"sys/devices/system/node/node0/cpulist": "0-7",
	}
	links := map[string]string{
		"sys/bus/pci/devices/" + ft.gpuAddr + "/iommu_group": "../../../../kernel/iommu_groups/" + ft.group,
		"sys/bus/pci/devices/0000:1a:00.0/virtfn0":           ft.vfTarget,
		"sys/class/nvme/nvme0/device":                        "../../../bus/pci/devices/0000:2a:00.0",
		"dev/disk/by-id/" + ft.byID:                          "../../nvme0n1",
	}
	for p, c := range files {
		full := filepath.Join(root, p)
		if os.MkdirAll(filepath.Dir(full), 0o755) != nil || os.WriteFile(full, []byte(c), 0o644) != nil {
			return false
		}
	}
	for p, target := range links {
		full := filepath.Join(root, p)
		if os.MkdirAll(filepath.Dir(full), 0o755) != nil || os.Symlink(target, full) != nil {
			return false
		}
	}
	return os.WriteFile(filepath.Join(root, "dev/nvme0n1"), ft.head, 0o644) == nil
}

// FuzzDiscover runs discovery over generated sysfs trees with hostile names, link targets and
// file contents. It never panics; every device address it reports is a PCI address; NUMA
// nodes are never negative; a GPU sharing its IOMMU group with any other device (PCI or not)
// is never ready; and no ready candidate offers a mounted, partitioned, signed or OS disk, or
// a disk without a plain by-id name.
func FuzzDiscover(f *testing.F) {
	mbr := make([]byte, 512)
	mbr[510], mbr[511] = 0x55, 0xaa
	f.Add("0000:1b:00.0", "0x10de", "0x030200", "0", "10", "0000:1b:00.1", "../0000:1a:00.2", "nvme-eui.0025388b01000001", "", "7814037168", []byte{})
	f.Add("0000:1b:00.0", "0x10de", "0x030200", "0", "10", "0000:1b:00.1", "../0000:1a:00.2", "nvme-eui.1", "/dev/nvme0n1 / ext4 rw 0 0\n", "1", mbr)
	f.Add("0000:1b:00.0", "0x10de", "0x030200", "-1", "10", "0000:99:00.0", "..", "nvme-eui.1", "/dev/nvme0n1p1 /data xfs rw 0 0\n", "x", []byte("XFSB"))
	f.Add("1b", "0x10de", "0x0302", "0", "7", "x", "/", "nvme-eui.1\nroot", "garbage", "-9", []byte{}) // an address with no '.'
	f.Add("10000:e1:00.0", "0x1002", "0x030000", "99999999999999999999", "-3", "p", "../../../../etc", "wwn-0x5", "", "", []byte{})
	base := fuzzBase(f)
	f.Fuzz(func(t *testing.T, gpuAddr, vendor, class, numa, group, peer, vfTarget, byID, mounts, size string, head []byte) {
		if len(head) > 70<<10 {
			return
		}
		ft := fuzzTree{gpuAddr, vendor, class, numa, group, peer, vfTarget, byID, mounts, size, head}
		root, err := os.MkdirTemp(base, "host")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(root)
		if !ft.write(root) {
			return
		}
		r, err := Discover(hostfs.New(root))
		if err != nil {
			t.Fatalf("discovery failed on a tree with a PCI directory: %v", err)
		}
		pcis := []string{}
		sharedGroup := map[string]bool{} // GPUs whose IOMMU group holds another device
		for _, g := range r.GPUs {
			pcis = append(pcis, g.PCIAddress)
			checkNUMA(t, g.NUMANode)
			if g.IOMMUGroup != nil && *g.IOMMUGroup < 0 {
				t.Fatalf("IOMMU group %d", *g.IOMMUGroup)
			}
			// Group members are listed as they are (a group may hold non-PCI devices); any
			// that is not one of the GPU's own functions keeps it out of a slice.
			for _, p := range g.IOMMUPeers {
				if !strings.HasPrefix(p, g.PCIAddress[:len(g.PCIAddress)-1]) {
					sharedGroup[g.PCIAddress] = true
				}
			}
		}
		for _, fb := range r.Fabric {
			pcis = append(append(pcis, fb.PCIAddress), fb.VFs...)
			checkNUMA(t, fb.NUMANode)
		}
		for _, n := range r.NVMe {
			if n.PCIAddress != "" {
				pcis = append(pcis, n.PCIAddress)
			}
			checkNUMA(t, n.NUMANode)
		}
		for _, a := range pcis {
			if !pciAddrRE.MatchString(a) {
				t.Fatalf("reported %q as a PCI address", a)
			}
		}
		for _, c := range r.Candidates {
			if c.Ready && sharedGroup[c.GPUPCI] {
				t.Fatalf("candidate %d is ready although GPU %s shares its IOMMU group", c.SlotIndex, c.GPUPCI)
			}
			if !c.Ready {
				if len(c.BlockingReasons) == 0 {
					t.Fatalf("candidate %d blocked without a reason", c.SlotIndex)
				}
				continue
			}
			for _, n := range r.NVMe {
				if n.ByID == c.NVMeDevice && (n.OSDisk || len(n.Mounts) > 0 || len(n.Partitions) > 0 || n.Signature != "") {
					t.Fatalf("ready candidate offers disk %+v", n)
				}
			}
			if !strings.HasPrefix(c.NVMeDevice, "/dev/disk/by-id/") || strings.ContainsAny(c.NVMeDevice[len("/dev/disk/by-id/"):], "/\n\r\t ") {
				t.Fatalf("ready candidate disk %q", c.NVMeDevice)
			}
		}
	})
}

// fuzzBase holds the generated trees: in memory (/dev/shm) where there is one, since each
// input writes a whole small host.
func fuzzBase(f *testing.F) string {
	if dir, err := os.MkdirTemp("/dev/shm", "gpuaas-fuzz-"); err == nil {
		f.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return f.TempDir()
}

func checkNUMA(t *testing.T, n *int) {
	t.Helper()
	if n != nil && *n < 0 {
		t.Fatalf("NUMA node %d", *n)
	}
}
