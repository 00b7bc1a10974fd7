package topology

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

var update = flag.Bool("update", false, "rewrite golden files")

func discover(t *testing.T, variant string) *Report {
	t.Helper()
	root := t.TempDir()
	if err := fixture.Write(root, fixture.Variants[variant]()); err != nil {
		t.Fatal(err)
	}
	r, err := Discover(hostfs.New(root))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func reasons(r *Report) string {
	var all []string
	for _, c := range r.Candidates {
		all = append(all, c.BlockingReasons...)
	}
	return strings.Join(all, "\n")
}

func TestH200AllCandidatesReadyAndGolden(t *testing.T) {
	r := discover(t, "h200")
	if len(r.GPUs) != 8 || len(r.NVMe) != 9 || len(r.Fabric) != 8 || len(r.NUMA) != 2 {
		t.Fatalf("found %d GPUs, %d NVMe, %d fabric, %d NUMA", len(r.GPUs), len(r.NVMe), len(r.Fabric), len(r.NUMA))
	}
	g := r.GPUs[0]
	if g.PCIAddress != "0000:1b:00.0" || g.Model != "NVIDIA H200 SXM 141GB" || *g.NUMANode != 0 || g.Driver != "vfio-pci" || *g.IOMMUGroup != 10 {
		t.Fatalf("gpu 0 = %+v", g)
	}
	if f := r.Fabric[0]; f.Fabric != "infiniband" || f.RDMADevice != "mlx5_0" || len(f.VFs) != 1 || f.VFs[0] != "0000:1a:00.2" || f.Ports[0].State != "4: ACTIVE" {
		t.Fatalf("fabric 0 = %+v", f)
	}
	os := r.NVMe[0]
	if !os.OSDisk || os.Signature != "gpt, PMBR" || len(os.Partitions) != 2 {
		t.Fatalf("OS disk = %+v", os)
	}
	for i, c := range r.Candidates {
		if !c.Ready || !c.ApprovalRequired || len(c.BlockingReasons) != 0 {
			t.Fatalf("candidate %d blocked: %+v", i, c)
		}
		if !strings.HasPrefix(c.NVMeDevice, "/dev/disk/by-id/nvme-eui.") || c.NVMeNamespace == "nvme0n1" {
			t.Fatalf("candidate %d NVMe %s (the OS disk must never be offered)", i, c.NVMeDevice)
		}
		if *c.NUMANode != i/4 || c.FabricVFPCI == "" {
			t.Fatalf("candidate %d = %+v", i, c)
		}
	}
	got, _ := json.MarshalIndent(r, "", "  ")
	golden := filepath.Join("testdata", "h200.golden.json")
	if *update {
		if err := writeFile(golden, got); err != nil {
			t.Fatal(err)
		}
	}
	want, err := readFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if string(got) != string(want) {
		t.Fatalf("discovery output differs from %s (go test ./internal/topology -update to accept)", golden)
	}
}

func TestDegradedHostsAreBlockedWithReasons(t *testing.T) {
	cases := map[string]struct {
		want    string
		blocked int
	}{
		"h200-no-vfs":        {"only the parent fabric device", 8},
		"h200-shared-parent": {"only the parent fabric device", 6},
		"h200-mounted-share": {"is mounted at /mnt/share", 8},
		"h200-unknown-numa":  {"NUMA node unknown", 8},
		"h200-host-driver":   {"bound to nvidia", 8},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := discover(t, name)
			blocked := 0
			for _, cand := range r.Candidates {
				if !cand.Ready {
					blocked++
				}
			}
			if blocked != c.blocked || !strings.Contains(reasons(r), c.want) {
				t.Fatalf("%d blocked (want %d); reasons:\n%s", blocked, c.blocked, reasons(r))
			}
		})
	}
	r := discover(t, "h200-host-driver")
	if !strings.Contains(strings.Join(r.Candidates[0].BlockingReasons, "\n"), "shared with unrelated devices 0000:19:00.0") {
		t.Fatalf("IOMMU sharing not reported: %v", r.Candidates[0].BlockingReasons)
	}
	r = discover(t, "h200-mounted-share")
	if !strings.Contains(reasons(r), "has partitions") || !strings.Contains(reasons(r), "gpt, PMBR signature") {
		t.Fatalf("share partitions/signature not reported:\n%s", reasons(r))
	}
}

// The real H100 Firecracker guest seen in LAB.md: one GPU, numa -1, no IOMMU, no NVMe, no IB.
func TestSparseHostDegradesGracefully(t *testing.T) {
	root := t.TempDir()
	s := fixture.Spec{Hostname: "fc", GPUs: []fixture.GPU{{Addr: "0000:00:06.0", Vendor: "0x10de", Device: "0x2330", Driver: "nvidia", NUMA: -1, IOMMUGroup: -1}}}
	if err := fixture.Write(root, s); err != nil {
		t.Fatal(err)
	}
	r, err := Discover(hostfs.New(root))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GPUs) != 1 || r.GPUs[0].NUMANode != nil || r.GPUs[0].Model != "NVIDIA H100 SXM5 80GB" || len(r.Candidates) != 1 || r.Candidates[0].Ready {
		t.Fatalf("report = %+v", r)
	}
	got := strings.Join(r.Candidates[0].BlockingReasons, "\n")
	for _, want := range []string{"NUMA node unknown", "bound to nvidia", "no IOMMU group", "no NVMe device found on this host", "no NUMA-local fabric"} {
		if !strings.Contains(got, want) {
			t.Fatalf("missing %q in:\n%s", want, got)
		}
	}
	if _, err := Discover(hostfs.New(t.TempDir())); err == nil {
		t.Fatal("an empty tree (no /sys) was read as a host")
	}
}

func TestSignatures(t *testing.T) {
	for fs, want := range map[string]string{"ext4": "ext4", "xfs": "xfs", "gpt": "gpt, PMBR", "": ""} {
		root := t.TempDir()
		s := fixture.H200()
		s.Disks[0].FS = fs
		if err := fixture.Write(root, s); err != nil {
			t.Fatal(err)
		}
		r, _ := Discover(hostfs.New(root))
		var got string
		for _, n := range r.NVMe {
			if n.Controller == "nvme1" {
				got = n.Signature
			}
		}
		if got != want {
			t.Fatalf("fs %q detected as %q", fs, got)
		}
	}
}

func writeFile(p string, b []byte) error { return os.WriteFile(p, b, 0o644) }
func readFile(p string) ([]byte, error)  { return os.ReadFile(p) }

func TestDriftAgainstApprovedSlots(t *testing.T) {
	r := discover(t, "h200")
	var approved []Approved
	for _, c := range r.Candidates {
		approved = append(approved, Approved{SlotIndex: c.SlotIndex, GPUPCI: c.GPUPCI, NVMeDevice: c.NVMeDevice, FabricVFPCI: c.FabricVFPCI})
	}
	if d := Drift(r, approved); len(d) != 0 {
		t.Fatalf("fresh host drifts: %v", d)
	}
	// The host changes under slots 2, 5 and 7 only.
	r.NVMe[3].Mounts = []string{"/mnt/oops"} // nvme3 is slot 2's disk (index 0 is the OS disk)
	r.Fabric[5].VFs = nil
	r.GPUs = r.GPUs[:7]
	d := Drift(r, approved)
	if len(d) != 3 || !strings.Contains(strings.Join(d[2], ";"), "now mounted at [/mnt/oops]") ||
		!strings.Contains(strings.Join(d[5], ";"), "fabric VF 0000:ba:00.2 is gone") ||
		!strings.Contains(strings.Join(d[7], ";"), "GPU 0000:dc:00.0 is no longer on the host") {
		t.Fatalf("drift = %v", d)
	}
}

// Discovery groups each NUMA node's CPUs into cores from the SMT sibling lists, trusting a
// list only within the node and only for CPUs not yet grouped: the groups always partition
// the node's CPUs. A list naming a CPU of another node, an unreadable or garbled list, or one
// that claims an already grouped CPU leaves the CPU a core alone.
func TestDiscoverCoresPartitionTheNode(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"sys/bus/pci/devices/.keep":                                 "",
		"sys/devices/system/node/node0/cpulist":                     "0-7\n",
		"sys/devices/system/node/node1/cpulist":                     "8-9\n",
		"sys/devices/system/cpu/cpu0/topology/core_cpus_list":       "0,4\n",
		"sys/devices/system/cpu/cpu4/topology/core_cpus_list":       "0,4\n",
		"sys/devices/system/cpu/cpu1/topology/thread_siblings_list": "1,8\n", // 8 is node 1's
		"sys/devices/system/cpu/cpu2/topology/core_cpus_list":       "2-x\n",
		"sys/devices/system/cpu/cpu3/topology/core_cpus_list":       "0,3\n", // 0 is grouped with 4
		"sys/devices/system/cpu/cpu8/topology/core_cpus_list":       "8-9\n",
	}
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Discover(hostfs.New(root))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal([]any{r.NUMA[0].Cores, r.NUMA[1].Cores})
	if want := `[["0,4","1","2","3","5","6","7"],["8-9"]]`; string(got) != want {
		t.Fatalf("cores = %s; want %s", got, want)
	}
}

// TestPrintTableOnAHostWithoutNVMeOrFabric: a device kind that is absent is one line saying
// so (no header-only table), each blocking reason has a line of its own, a GPU without NVMe
// on a host with none says so, and a summary line counts the ready candidates.
func TestPrintTableOnAHostWithoutNVMeOrFabric(t *testing.T) {
	s := fixture.H200()
	s.Disks, s.Fabrics, s.Fstab = nil, nil, nil
	root := t.TempDir()
	if err := fixture.Write(root, s); err != nil {
		t.Fatal(err)
	}
	rep, err := Discover(hostfs.New(root))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := PrintTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"NVMe: no NVMe device found\n", "Fabric: no InfiniBand/RoCE device found\n",
		"slot 0 is blocked:\n  - no NVMe device found on this host\n", "0 of 8 candidate slots ready\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "NVME") || strings.HasPrefix(line, "FABRIC") || strings.Count(line, ";") > 0 {
			t.Errorf("line %q: a header-only table or reasons joined on one line", line)
		}
	}
}
