package topology

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/disk/disktest"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

// TestDiscoveryFindsEverySignature: discovery's "is this disk clean?" check sees every
// signature the disk probe knows, wherever it sits on the device. A fixture H200 host whose
// first slot disk (nvme1n1) is a real loop device carrying an LVM2 PV, a LUKS header, an
// mdraid member (0.90 and 1.0 at the end of the device), a ZFS label, a filesystem or a
// partition table: the candidate is blocked with the signature named, and an approved slot
// on that disk drifts. A fixed-offset sniff of the first 68 KiB missed LVM, LUKS, mdraid
// and ZFS.
func TestDiscoveryFindsEverySignature(t *testing.T) {
	for _, k := range disktest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			m := disktest.Carry(t, k)
			r := discoverWithDisk(t, "nvme1n1", m.Dev)
			c := candidateOn(t, r, "nvme1n1")
			want := "NVMe nvme1n1 carries a "
			if c.Ready || !strings.Contains(strings.Join(c.BlockingReasons, "\n"), want) ||
				!strings.Contains(strings.Join(c.BlockingReasons, "\n"), k.Want) {
				t.Fatalf("%s (%s): candidate %d ready=%v, reasons %q; want blocked naming %s", k.Name, m.How, c.SlotIndex, c.Ready, c.BlockingReasons, k.Want)
			}
			drift := Drift(r, []Approved{{SlotIndex: c.SlotIndex, GPUPCI: c.GPUPCI, NVMeDevice: c.NVMeDevice, FabricVFPCI: c.FabricVFPCI}})
			if d := strings.Join(drift[c.SlotIndex], "\n"); !strings.Contains(d, "now carries data (") || !strings.Contains(d, k.Want) {
				t.Fatalf("%s: an approved slot on the disk does not drift: %v", k.Name, drift)
			}
		})
	}
}

// TestDiscoveryUnprobeableDiskIsNotClean: a disk the probe cannot read (here a by-id target
// that is gone) blocks its candidate and drifts its slot; it never reads as clean.
func TestDiscoveryUnprobeableDiskIsNotClean(t *testing.T) {
	disktest.Need(t, "wipefs", "blkid")
	r := discoverWithDisk(t, "nvme1n1", filepath.Join(t.TempDir(), "gone"))
	c := candidateOn(t, r, "nvme1n1")
	if c.Ready || !strings.Contains(strings.Join(c.BlockingReasons, "\n"), "could not be probed for signatures") {
		t.Fatalf("candidate on an unreadable disk: ready=%v %q", c.Ready, c.BlockingReasons)
	}
	drift := Drift(r, []Approved{{SlotIndex: c.SlotIndex, GPUPCI: c.GPUPCI, NVMeDevice: c.NVMeDevice, FabricVFPCI: c.FabricVFPCI}})
	if !strings.Contains(strings.Join(drift[c.SlotIndex], "\n"), "can no longer be probed") {
		t.Fatalf("an approved slot on an unreadable disk does not drift: %v", drift)
	}
}

// discoverWithDisk discovers the fixture H200 host with /dev/<ns> replaced by a link to dev.
func discoverWithDisk(t *testing.T, ns, dev string) *Report {
	t.Helper()
	root := t.TempDir()
	if err := fixture.Write(root, fixture.H200()); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "dev", ns)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dev, p); err != nil {
		t.Fatal(err)
	}
	r, err := Discover(hostfs.New(root))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func candidateOn(t *testing.T, r *Report, ns string) Candidate {
	t.Helper()
	for _, c := range r.Candidates {
		if c.NVMeNamespace == ns {
			return c
		}
	}
	t.Fatalf("no candidate on %s: %+v", ns, r.Candidates)
	return Candidate{}
}
