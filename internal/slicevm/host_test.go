package slicevm

import (
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/cpuset"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

func numa(n int) *int { return &n }

func plan() *task.VMProvision {
	return &task.VMProvision{AllocationID: "0c989b43-1111-2222-3333-444455556666",
		Profile: task.Profile{Name: "h200_2g", GPUCount: 2, VCPUCount: 48, MemoryMiB: 131072, Hugepages: []byte(`{"size":"1G"}`)},
		Image:   task.Image{Slug: "ubuntu", Username: "ubuntu", DigestSHA256: strings.Repeat("a", 64)},
		Bundles: []task.Bundle{
			{SlotID: "s0", SlotIndex: 0, GPUPCI: "0000:1b:00.0", FabricVFPCI: "0000:1a:00.2", NVMeDevice: "/dev/disk/by-id/nvme-eui.0000000000020000",
				NUMANode: numa(0), MACAddress: "52:54:00:01:00:00", PrivateIP: "10.100.0.10", VCPUCount: 24, MemoryMiB: 65536, HostCPUs: "1-12,97-108"},
			{SlotID: "s1", SlotIndex: 1, GPUPCI: "0000:3c:00.0", FabricVFPCI: "0000:3a:00.2", NVMeDevice: "/dev/disk/by-id/nvme-eui.0000000000020001",
				NUMANode: numa(0), MACAddress: "52:54:00:01:00:01", PrivateIP: "10.100.0.11", VCPUCount: 24, MemoryMiB: 65536, HostCPUs: "13-24,109-120"},
		},
		HousekeepingCPUs: "0,96"}
}

func hostTree(t *testing.T) hostfs.FS {
	t.Helper()
	root := t.TempDir()
	if err := fixture.Write(root, fixture.H200()); err != nil {
		t.Fatal(err)
	}
	return hostfs.New(root)
}

func validateXML(t *testing.T, x []byte) {
	t.Helper()
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI needs virt-xml-validate (apt-get install libvirt-clients)")
		}
		t.Skip("virt-xml-validate not installed (apt-get install libvirt-clients)")
	}
	p := filepath.Join(t.TempDir(), "d.xml")
	if err := os.WriteFile(p, x, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("virt-xml-validate", p, "domain").CombinedOutput(); err != nil {
		t.Fatalf("libvirt's schema rejects the domain: %v\n%s\n%s", err, out, x)
	}
}

func TestBuildDomainProductionFromPlan(t *testing.T) {
	x, placed, err := BuildDomain(DomainInput{Plan: plan(), SeedISO: "/var/lib/gpuaas/slices/x/seed.iso", NVRAM: "/var/lib/gpuaas/slices/x/OVMF_VARS.fd",
		ConsoleLog: "/var/lib/gpuaas/slices/x/console.log", Bridge: "ovsbr0", OVS: true, Loader: "/usr/share/OVMF/OVMF_CODE_4M.fd", FS: hostTree(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := string(x)
	// Summed across slots; each slot's vCPUs on its own CPUs of NUMA node 0 ("0-47,96-143"),
	// the emulator and I/O threads on the housekeeping CPUs, memory strictly on node 0.
	for _, want := range []string{`<domain type="kvm">`, `<memory unit="MiB">131072</memory>`, `<vcpu placement="static">48</vcpu>`,
		`<vcpupin vcpu="0" cpuset="1">`, `<vcpupin vcpu="23" cpuset="108">`, `<vcpupin vcpu="24" cpuset="13">`, `<vcpupin vcpu="47" cpuset="120">`,
		`<emulatorpin cpuset="0,96">`, `<iothreadpin iothread="1" cpuset="0,96">`, `<memory mode="strict" nodeset="0">`,
		`<memnode cellid="0" mode="strict" nodeset="0">`, `<cell id="0" cpus="0-47" memory="131072" unit="MiB">`, `model="pcie-expander-bus"`,
		`<hugepages>`, `<virtualport type="openvswitch">`,
		`<mac address="52:54:00:01:00:00">`, `<log file="/var/lib/gpuaas/slices/x/console.log"`, `secure="no"`,
		`bus="0x1b"`, `bus="0x1a" slot="0x00" function="0x2"`, `bus="0x3c"`, `bus="0x3a" slot="0x00" function="0x2"`} {
		if !strings.Contains(s, want) {
			t.Errorf("domain lacks %s", want)
		}
	}
	if n := strings.Count(s, "<hostdev "); n != 4 {
		t.Errorf("%d hostdevs, want one per GPU and VF (4)", n)
	}
	for _, bad := range []string{"<tpm", "<graphics", "vcpupin vcpu=\"48\"", `cpuset="0"`} {
		if strings.Contains(s, bad) {
			t.Errorf("domain has %s", bad)
		}
	}
	if placed != "48 vCPUs pinned to slot CPUs 1-24,97-120; emulator and I/O threads on 0,96; 1 guest NUMA cell(s) for host node(s) 0" {
		t.Errorf("placement summary %q", placed)
	}
	validateXML(t, x)
}

// pins reads a domain's vCPU pins back: vCPU -> host CPU set.
func pins(t *testing.T, x []byte) map[int][]int {
	t.Helper()
	var d struct {
		Pins []struct {
			VCPU   int    `xml:"vcpu,attr"`
			CPUSet string `xml:"cpuset,attr"`
		} `xml:"cputune>vcpupin"`
	}
	if err := xml.Unmarshal(x, &d); err != nil {
		t.Fatal(err)
	}
	out := map[int][]int{}
	for _, p := range d.Pins {
		c, err := cpuset.Parse(p.CPUSet)
		if err != nil {
			t.Fatal(err)
		}
		out[p.VCPU] = c
	}
	return out
}

// Two slices on one NUMA node run on disjoint CPUs: each on its own slot's set, neither on
// the housekeeping CPUs (before, both took the node's first CPUs, CPU 0 included).
func TestTwoVMsOnOneNodeGetDisjointPins(t *testing.T) {
	fs := hostTree(t)
	var all [][]int
	for i, alloc := range []string{"aaaaaaaa-1111-2222-3333-444455556666", "bbbbbbbb-1111-2222-3333-444455556666"} {
		p := plan()
		p.AllocationID = alloc
		p.Bundles = p.Bundles[i : i+1]
		p.Bundles[0].VCPUCount, p.Bundles[0].MemoryMiB = 8, 4096
		x, _, err := BuildDomain(DomainInput{Plan: p, SeedISO: "/s/seed.iso", Bridge: "ovsbr0", OVS: true, FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		own, _ := cpuset.Parse(p.Bundles[0].HostCPUs)
		var used []int
		for v, c := range pins(t, x) {
			if len(c) != 1 || len(cpuset.Overlap(c, own)) != 1 {
				t.Fatalf("VM %d vCPU %d pinned to %v, outside its slot's CPUs %s", i, v, c, p.Bundles[0].HostCPUs)
			}
			used = cpuset.Union(used, c)
		}
		if len(used) != 8 {
			t.Fatalf("VM %d: 8 vCPUs on %d CPUs", i, len(used))
		}
		all = append(all, used)
	}
	if both := cpuset.Overlap(all[0], all[1]); len(both) > 0 {
		t.Fatalf("two VMs on NUMA node 0 share CPUs %v", both)
	}
	for _, u := range all {
		if hk := cpuset.Overlap(u, []int{0, 96}); len(hk) > 0 {
			t.Fatalf("a VM runs on housekeeping CPUs %v", hk)
		}
	}
}

// labTree is a small lab host: one NUMA node with CPUs 0-1.
func labTree(t *testing.T) hostfs.FS {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "sys/devices/system/node/node0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte("0-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return hostfs.New(root)
}

func TestBuildDomainLab(t *testing.T) {
	p := plan()
	p.Bundles[1].NUMANode = numa(1)
	x, placed, err := BuildDomain(DomainInput{Plan: p, Disks: []string{"/dev/loop3", "/dev/loop4"}, SeedISO: "/tmp/s/seed.iso", NVRAM: "/tmp/s/vars.fd",
		Lab: true, Bridge: "gpuaaslab0", OVS: true, Loader: "/usr/share/OVMF/OVMF_CODE_4M.fd", FS: labTree(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := string(x)
	// The guest's NUMA cells stay true to the slots (nodes 0 and 1, each disk under its own
	// cell's expander bus); memory is bound only to the node this host has.
	for _, want := range []string{`<domain type="qemu">`, `<source dev="/dev/loop3">`, `<source dev="/dev/loop4">`, `csum="off"`,
		`<cell id="0" cpus="0-23"`, `<cell id="1" cpus="24-47"`, `<memnode cellid="0" mode="strict" nodeset="0">`, `<node>1</node>`, `<emulatorpin cpuset="0">`} {
		if !strings.Contains(s, want) {
			t.Errorf("lab domain lacks %s", want)
		}
	}
	for _, want := range []string{"lab host (1 NUMA node(s), CPUs 0-1)", "NUMA node 1 absent here", "slot 0,1 vCPUs unpinned", "housekeeping CPUs 96 absent here"} {
		if !strings.Contains(placed, want) {
			t.Errorf("placement %q does not say %q", placed, want)
		}
	}
	// The lab passes nothing through, pins nothing it lacks, needs no hugepages and uses a
	// Linux bridge.
	for _, bad := range []string{"<hostdev", "vcpupin", `cellid="1"`, "<hugepages", "openvswitch"} {
		if strings.Contains(s, bad) {
			t.Errorf("lab domain has %s", bad)
		}
	}
	validateXML(t, x)
}

func TestBuildDomainRefusesBadPlans(t *testing.T) {
	fs := hostTree(t)
	in := func(mut func(p *task.VMProvision)) DomainInput {
		p := plan()
		mut(p)
		return DomainInput{Plan: p, SeedISO: "/s/seed.iso", Bridge: "ovsbr0", OVS: true, FS: fs}
	}
	cases := map[string]struct {
		in   DomainInput
		want string
	}{
		"device twice":           {in(func(p *task.VMProvision) { p.Bundles[1].GPUPCI = p.Bundles[0].GPUPCI }), "appears twice"},
		"no bundles":             {in(func(p *task.VMProvision) { p.Bundles = nil }), "no bundles"},
		"unknown NUMA node":      {in(func(p *task.VMProvision) { p.Bundles[0].NUMANode = numa(7) }), "slot 0 is on NUMA node 7, which this host does not have"},
		"too many vCPUs":         {in(func(p *task.VMProvision) { p.Bundles[0].VCPUCount = 500 }), "slot 0 has 500 vCPUs but host_cpus 1-12,97-108 holds 24 CPUs: refusing to over-subscribe"},
		"bad MAC":                {in(func(p *task.VMProvision) { p.Bundles[0].MACAddress = "zz" }), "MAC"},
		"no host CPUs":           {in(func(p *task.VMProvision) { p.Bundles[1].HostCPUs = "" }), "slot 1 has no host CPU set"},
		"CPUs off the node":      {in(func(p *task.VMProvision) { p.Bundles[1].HostCPUs = "13-24,48,109-120" }), "slot 1 host CPUs 48 are not on its NUMA node 0 (0-47,96-143)"},
		"bad CPU list":           {in(func(p *task.VMProvision) { p.Bundles[0].HostCPUs = "3-1" }), "slot 0 host_cpus: cpu list"},
		"no housekeeping":        {in(func(p *task.VMProvision) { p.HousekeepingCPUs = "" }), "no housekeeping CPUs"},
		"housekeeping on a slot": {in(func(p *task.VMProvision) { p.HousekeepingCPUs = "0,5" }), "housekeeping CPU 5 is slot 0's"},
		"two slots share CPUs":   {in(func(p *task.VMProvision) { p.Bundles[1].HostCPUs = "12-23,108-119" }), "host CPU 12 belongs to slots 0 and 1"},
	}
	for name, c := range cases {
		if x, _, err := BuildDomain(c.in); err == nil {
			t.Errorf("%s: built a domain\n%s", name, x)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// The lab relaxes what its host lacks, never the plan itself: a slot with fewer CPUs than
// vCPUs is refused there too, and a slot whose CPUs exist here is pinned to them.
func TestLabKeepsThePlansOwnChecks(t *testing.T) {
	p := plan()
	p.Bundles[0].HostCPUs = "1"
	if _, _, err := BuildDomain(DomainInput{Plan: p, SeedISO: "/s/seed.iso", Bridge: "gpuaaslab0", Lab: true, FS: labTree(t)}); err == nil ||
		!strings.Contains(err.Error(), "slot 0 has 24 vCPUs but host_cpus 1 holds 1 CPUs") {
		t.Fatalf("lab over-subscription: %v", err)
	}
	p = plan()
	p.Bundles = p.Bundles[:1]
	p.Bundles[0].VCPUCount, p.Bundles[0].HostCPUs, p.HousekeepingCPUs = 1, "1", "0"
	x, placed, err := BuildDomain(DomainInput{Plan: p, SeedISO: "/s/seed.iso", Bridge: "gpuaaslab0", Lab: true, FS: labTree(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(x), `<vcpupin vcpu="0" cpuset="1">`) || !strings.Contains(string(x), `<emulatorpin cpuset="0">`) ||
		!strings.HasPrefix(placed, "1 vCPUs pinned to slot CPUs 1; emulator and I/O threads on 0;") {
		t.Fatalf("lab slot with CPUs on this host not pinned (%s):\n%s", placed, x)
	}
}

func TestRecorderStatuses(t *testing.T) {
	rec := &Recorder{}
	if err := rec.RunDetail("a", func() (string, error) { return "did a", nil }); err != nil {
		t.Fatal(err)
	}
	if err := rec.Run("b", func() error { return Skip("lab host: no PCI passthrough") }); err != nil {
		t.Fatalf("a skip is not a failure: %v", err)
	}
	boom := errors.New("boom")
	if err := rec.Run("c", func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failure not returned: %v", err)
	}
	ph := rec.Phases()
	if len(ph) != 3 || ph[0].Status != "ok" || ph[0].Detail != "did a" || ph[1].Status != "skipped" ||
		ph[1].Detail != "lab host: no PCI passthrough" || ph[2].Status != "failed" || ph[2].Error != "boom" {
		t.Fatalf("phases %+v", ph)
	}
}

func TestEnsureTerminalKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "terminal", "id_ed25519")
	s1, pub1, err := EnsureTerminalKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(pub1, "ssh-ed25519 ") || !strings.HasSuffix(pub1, " gpuaas-terminal") {
		t.Fatalf("public key line %q", pub1)
	}
	for f, want := range map[string]os.FileMode{p: 0o600, p + ".pub": 0o644} {
		fi, err := os.Stat(f)
		if err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want %v", f, fi.Mode(), err, want)
		}
	}
	s2, pub2, err := EnsureTerminalKey(p)
	if err != nil || pub2 != pub1 || string(s2.PublicKey().Marshal()) != string(s1.PublicKey().Marshal()) {
		t.Fatalf("second call made a new key: %v", err)
	}
	if err := os.WriteFile(p, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := EnsureTerminalKey(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("corrupt key accepted: %v", err)
	}
}

func TestTailFileStripsTerminalEscapes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	log := "\x1b[2J\x1b[01;01Hfirst\r\n\x1b[1m\x1b[33mBdsDxe: loading\x1b[0m\r\n\r\nsecond\nthird " + strings.Repeat("x", 300) + "\n"
	if err := os.WriteFile(p, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got := tailFile(p, 3)
	if strings.ContainsRune(got, 0x1b) || strings.Contains(got, "[2J") || strings.Contains(got, "first") {
		t.Fatalf("tail %q", got)
	}
	if !strings.HasPrefix(got, "BdsDxe: loading | second | third xx") || !strings.HasSuffix(got, "…") {
		t.Fatalf("tail %q", got)
	}
	if tailFile(filepath.Join(t.TempDir(), "missing"), 3) != "" {
		t.Fatal("tail of a missing file")
	}
}

func TestHugepagesAndHostname(t *testing.T) {
	for raw, want := range map[string]bool{``: false, `null`: false, `false`: false, `{}`: false, `{"enabled": false}`: false,
		`true`: true, `{"size":"1G"}`: true, `{"enabled":true,"count":64}`: true} {
		if got := wantsHugepages([]byte(raw)); got != want {
			t.Errorf("wantsHugepages(%s) = %v", raw, got)
		}
	}
	if h := hostname("0C989B43-1111-2222"); h != "gpuaas-0c989b43" {
		t.Fatalf("hostname %q", h)
	}
}

func TestPlanInvalidError(t *testing.T) {
	err := planInvalid("slot %d disk %s is mounted", 0, "/dev/x")
	var pi *PlanInvalidError
	if !errors.As(err, &pi) || err.Error() != "plan_invalid: slot 0 disk /dev/x is mounted" {
		t.Fatalf("%v", err)
	}
	re := &ReadinessError{Stage: "ssh", Err: errors.New("EOF"), Console: "login:"}
	if re.Error() != "readiness ssh: EOF; console tail: login:" {
		t.Fatal(re.Error())
	}
}

func TestRecorderProgressIsNotAFinishedPhase(t *testing.T) {
	var updates [][]task.Phase
	rec := &Recorder{OnUpdate: func(p []task.Phase) { updates = append(updates, p) }}
	_ = rec.Run("lease_acquire", func() error { return nil })
	rec.Progress("image_stat_download", downloadDetail(50<<20, 100<<20))
	if len(updates) != 2 {
		t.Fatalf("%d updates", len(updates))
	}
	last := updates[1]
	if len(last) != 2 || last[1].Status != "running" || last[1].Detail != "50 of 100 MiB (50%)" {
		t.Fatalf("progress update %+v", last)
	}
	if ph := rec.Phases(); len(ph) != 1 {
		t.Fatalf("a running entry leaked into the phases: %+v", ph)
	}
	if d := downloadDetail(3<<20, -1); d != "3 MiB" {
		t.Fatal(d)
	}
}

func TestLeasedToOther(t *testing.T) {
	b := plan().Bundles[0]
	held := []leases.Lease{
		{SlotID: "s9", AllocationID: "mine", Devices: []string{b.NVMeDevice}},
		{SlotID: "s5", AllocationID: "other", Devices: []string{"0000:99:00.0", "0000:99:00.2", "/dev/disk/by-id/nvme-other"}},
	}
	if got := leasedToOther(held, b, "mine"); got != "" {
		t.Fatalf("own lease counted: %q", got)
	}
	held = append(held, leases.Lease{SlotID: "s7", AllocationID: "other2", Devices: []string{"", b.NVMeDevice}})
	if got := leasedToOther(held, b, "mine"); got != "other2" {
		t.Fatalf("disk leased to another allocation not seen: %q", got)
	}
	if got := leasedToOther([]leases.Lease{{SlotID: b.SlotID, AllocationID: "x"}}, b, "mine"); got != "x" {
		t.Fatalf("slot leased to another allocation not seen: %q", got)
	}
}

// The guest GPU check an image's smoke test shows: nvidia-smi's list against the slice's
// GPUs, or "no GPU here" on a lab host (emulated stand-ins: nothing to run it against).
func TestGPUCheckSaysWhatTheGuestListed(t *testing.T) {
	for _, c := range []struct {
		slots int
		lab   bool
		out   string
		err   error
		want  string
	}{
		{1, true, "", nil, "gpu_check none: no GPU here (lab host"},
		{2, false, "NVIDIA H200, 143771 MiB\nNVIDIA H200, 143771 MiB\n", nil, "gpu_check ok: nvidia-smi lists 2 GPUs: NVIDIA H200, 143771 MiB | NVIDIA H200"},
		{2, false, "NVIDIA H200, 143771 MiB\n", nil, "gpu_check failed: nvidia-smi in the guest lists 1 GPUs, the slice has 2"},
		{1, false, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n", errors.New("Process exited with status 9"),
			"gpu_check failed: nvidia-smi in the guest: Process exited with status 9: NVIDIA-SMI has failed"},
	} {
		if got := gpuCheck(c.slots, c.lab, c.out, c.err); !strings.HasPrefix(got, c.want) {
			t.Errorf("gpuCheck(%d, lab=%v, %q, %v) = %q, want %q…", c.slots, c.lab, c.out, c.err, got, c.want)
		}
	}
	if got := guestText([]byte("gpu_check ok: fake")); strings.Contains(got, "gpu_check") {
		t.Errorf("guest text %q can pose as the host's verdict", got)
	}
}
