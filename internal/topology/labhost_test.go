package topology

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// untar unpacks a snapshot (regular files, directories, symlinks) under a temp dir.
func untar(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return root
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, 0o644)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Discovery on a real kernel's sysfs: testdata/labhost-sysfs.tar.gz is what the lab host VM's
// kernel showed (make lab-host with GPUAAS_LABHOST_SNAPSHOT; internal/labhost/snapshot.sh), in
// a layout of two GPU stand-ins and two slot disks per node: display controllers standing in
// for GPUs and NVMe controllers on PCIe expander buses bound to NUMA nodes 0 and 1 behind an
// emulated Intel IOMMU, an NVMe controller with two SR-IOV VFs per node standing in for the
// fabric NIC, and one GPU stand-in behind a PCIe-to-PCI bridge sharing its IOMMU group. Production discovery counts none of the stand-ins; lab-host discovery finds
// every one with the NUMA node and IOMMU group the kernel gave it.
func TestDiscoverLabHostKernelSnapshot(t *testing.T) {
	root := untar(t, filepath.Join("testdata", "labhost-sysfs.tar.gz"))
	fs := hostfs.New(root)
	prod, err := Discover(fs)
	if err != nil {
		t.Fatal(err)
	}
	if len(prod.GPUs) != 0 || len(prod.Fabric) != 0 || prod.LabStandIns {
		t.Fatalf("production discovery counted stand-ins: %d GPUs, %d fabric", len(prod.GPUs), len(prod.Fabric))
	}
	r, err := DiscoverWith(fs, Options{LabStandIns: true})
	if err != nil {
		t.Fatal(err)
	}
	if !r.LabStandIns || len(r.GPUs) != 5 || len(r.Fabric) != 2 || len(r.NVMe) != 4 || len(r.NUMA) != 2 {
		t.Fatalf("lab host: %d GPUs, %d fabric, %d NVMe, %d NUMA nodes; want 5, 2, 4, 2", len(r.GPUs), len(r.Fabric), len(r.NVMe), len(r.NUMA))
	}
	groups := map[int]string{}
	for _, g := range r.GPUs {
		if g.Model != LabStandInModel || g.NUMANode == nil || g.IOMMUGroup == nil || g.Driver != "bochs-drm" {
			t.Fatalf("GPU stand-in %+v", g)
		}
		if other, dup := groups[*g.IOMMUGroup]; dup {
			t.Fatalf("%s and %s share IOMMU group %d", other, g.PCIAddress, *g.IOMMUGroup)
		}
		groups[*g.IOMMUGroup] = g.PCIAddress
	}
	for i, f := range r.Fabric {
		if f.Fabric != LabFabric || f.NUMANode == nil || *f.NUMANode != i || len(f.VFs) != 2 || f.SRIOVNum != 2 {
			t.Fatalf("fabric stand-in %d: %+v", i, f)
		}
	}
	for _, n := range r.NVMe {
		if n.NUMANode == nil || !strings.HasPrefix(n.ByID, "/dev/disk/by-id/nvme-") || n.OSDisk {
			t.Fatalf("slot disk %+v", n)
		}
	}
	// GPUs on their native driver block their candidates unless hostd may rebind them.
	for _, c := range r.Candidates {
		if c.Ready {
			t.Fatalf("candidate %d ready with its GPU on bochs-drm and no rebinding", c.SlotIndex)
		}
	}
	r, err = DiscoverWith(fs, Options{LabStandIns: true, VFIORebind: true})
	if err != nil {
		t.Fatal(err)
	}
	ready := 0
	for _, c := range r.Candidates {
		if c.Ready {
			ready++
			// The bundle is NUMA-local: the GPU, its disk and its VF on one node.
			var diskNUMA, vfNUMA *int
			for _, n := range r.NVMe {
				if n.ByID == c.NVMeDevice {
					diskNUMA = n.NUMANode
				}
			}
			for _, f := range r.Fabric {
				for _, vf := range f.VFs {
					if vf == c.FabricVFPCI {
						vfNUMA = f.NUMANode
					}
				}
			}
			if !sameNUMA(c.NUMANode, diskNUMA) || !sameNUMA(c.NUMANode, vfNUMA) {
				t.Fatalf("candidate %d is not NUMA-local: %+v", c.SlotIndex, c)
			}
			continue
		}
		if why := strings.Join(c.BlockingReasons, "; "); !strings.Contains(why, "is shared with unrelated devices") {
			t.Fatalf("candidate %d blocked for %q, want only the shared IOMMU group", c.SlotIndex, why)
		}
	}
	if ready != 4 {
		t.Fatalf("%d ready candidates, want 4 (the shared-group one blocked)", ready)
	}
}
