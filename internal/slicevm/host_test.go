package slicevm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
				NUMANode: numa(0), MACAddress: "52:54:00:01:00:00", PrivateIP: "10.100.0.10", VCPUCount: 24, MemoryMiB: 65536},
			{SlotID: "s1", SlotIndex: 1, GPUPCI: "0000:3c:00.0", FabricVFPCI: "0000:3a:00.2", NVMeDevice: "/dev/disk/by-id/nvme-eui.0000000000020001",
				NUMANode: numa(0), MACAddress: "52:54:00:01:00:01", PrivateIP: "10.100.0.11", VCPUCount: 24, MemoryMiB: 65536},
		}}
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
	x, err := BuildDomain(DomainInput{Plan: plan(), SeedISO: "/var/lib/gpuaas/slices/x/seed.iso", NVRAM: "/var/lib/gpuaas/slices/x/OVMF_VARS.fd",
		ConsoleLog: "/var/lib/gpuaas/slices/x/console.log", Bridge: "ovsbr0", OVS: true, Loader: "/usr/share/OVMF/OVMF_CODE_4M.fd", FS: hostTree(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := string(x)
	// Summed across slots; pinned to NUMA node 0 of the fixture ("0-47,96-143").
	for _, want := range []string{`<domain type="kvm">`, `<memory unit="MiB">131072</memory>`, `<vcpu placement="static">48</vcpu>`,
		`<vcpupin vcpu="0" cpuset="0">`, `<vcpupin vcpu="47" cpuset="47">`, `nodeset="0"`, `<hugepages>`, `<virtualport type="openvswitch">`,
		`<mac address="52:54:00:01:00:00">`, `<log file="/var/lib/gpuaas/slices/x/console.log"`, `secure="no"`,
		`bus="0x1b"`, `bus="0x1a" slot="0x00" function="0x2"`, `bus="0x3c"`, `bus="0x3a" slot="0x00" function="0x2"`} {
		if !strings.Contains(s, want) {
			t.Errorf("domain lacks %s", want)
		}
	}
	if n := strings.Count(s, "<hostdev "); n != 4 {
		t.Errorf("%d hostdevs, want one per GPU and VF (4)", n)
	}
	for _, bad := range []string{"<tpm", "<graphics", "vcpupin vcpu=\"48\""} {
		if strings.Contains(s, bad) {
			t.Errorf("domain has %s", bad)
		}
	}
	validateXML(t, x)
}

func TestBuildDomainLab(t *testing.T) {
	x, err := BuildDomain(DomainInput{Plan: plan(), Disks: []string{"/dev/loop3", "/dev/loop4"}, SeedISO: "/tmp/s/seed.iso", NVRAM: "/tmp/s/vars.fd",
		Lab: true, Bridge: "gpuaaslab0", OVS: true, Loader: "/usr/share/OVMF/OVMF_CODE_4M.fd", FS: hostfs.New(t.TempDir())})
	if err != nil {
		t.Fatal(err)
	}
	s := string(x)
	for _, want := range []string{`<domain type="qemu">`, `<source dev="/dev/loop3">`, `<source dev="/dev/loop4">`, `csum="off"`} {
		if !strings.Contains(s, want) {
			t.Errorf("lab domain lacks %s", want)
		}
	}
	// The lab passes nothing through, pins nothing, needs no hugepages and uses a Linux bridge.
	for _, bad := range []string{"<hostdev", "vcpupin", "numatune", "<hugepages", "openvswitch"} {
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
	cases := map[string]DomainInput{
		"device twice":      in(func(p *task.VMProvision) { p.Bundles[1].GPUPCI = p.Bundles[0].GPUPCI }),
		"no bundles":        in(func(p *task.VMProvision) { p.Bundles = nil }),
		"unknown NUMA node": in(func(p *task.VMProvision) { p.Bundles[0].NUMANode = numa(7) }),
		"too many vCPUs":    in(func(p *task.VMProvision) { p.Bundles[0].VCPUCount = 500 }),
		"bad MAC":           in(func(p *task.VMProvision) { p.Bundles[0].MACAddress = "zz" }),
	}
	for name, c := range cases {
		if _, err := BuildDomain(c); err == nil {
			t.Errorf("%s: built a domain", name)
		}
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
