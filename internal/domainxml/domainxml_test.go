package domainxml

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func numa(n int) *int { return &n }

func prod() Spec {
	return Spec{Name: "gpuaas-0c989b43", VCPUs: 48, MemoryMiB: 131072, Hugepages: true,
		Bundles: []Bundle{
			{GPUPCI: "0000:1b:00.0", FabricVFPCI: "0000:1a:00.2", Disk: "/dev/disk/by-id/nvme-eui.0025388b01000001", NUMANode: numa(0), MemoryNode: numa(0),
				VCPUs: 24, MemoryMiB: 65536, CPUs: span(2, 13, 98, 109)},
			{GPUPCI: "0000:3c:00.0", FabricVFPCI: "0000:3a:00.2", Disk: "/dev/disk/by-id/nvme-eui.0025388b01000002", NUMANode: numa(0), MemoryNode: numa(0),
				VCPUs: 24, MemoryMiB: 65536, CPUs: span(14, 25, 110, 121)},
		},
		HousekeepingCPUs: []int{0, 1, 96, 97},
		SeedISO:          "/var/lib/gpuaas/slices/0c989b43/seed.iso", MAC: "52:54:00:01:00:00", Bridge: "ovsbr0", OVS: true,
		LoaderPath: "/usr/share/OVMF/OVMF_CODE_4M.fd", NVRAMPath: "/var/lib/gpuaas/slices/0c989b43/OVMF_VARS.fd"}
}

func validate(t *testing.T, x []byte) {
	t.Helper()
	for _, tool := range []string{"virt-xml-validate", "xmllint"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI needs %s (apt-get install libvirt-clients libxml2-utils)", tool)
			}
			t.Skipf("%s not installed (apt-get install libvirt-clients libxml2-utils)", tool)
		}
	}
	p := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(p, x, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("virt-xml-validate", p, "domain").CombinedOutput(); err != nil {
		t.Fatalf("libvirt's schema rejects the domain: %v\n%s\n%s", err, out, x)
	}
}

// span is the CPUs a..b and c..d (a slot's cores and their SMT siblings).
func span(a, b, c, d int) []int {
	var out []int
	for _, r := range [][2]int{{a, b}, {c, d}} {
		for x := r[0]; x <= r[1]; x++ {
			out = append(out, x)
		}
	}
	return out
}

func TestProductionDomain(t *testing.T) {
	x, err := Build(prod())
	if err != nil {
		t.Fatal(err)
	}
	s := string(x)
	// Slot 0's 24 vCPUs on its own CPUs 2-13,98-109, slot 1's on 14-25,110-121: never CPU 0.
	if !strings.Contains(s, `<vcpupin vcpu="0" cpuset="2">`) || !strings.Contains(s, `<vcpupin vcpu="23" cpuset="109">`) ||
		!strings.Contains(s, `<vcpupin vcpu="24" cpuset="14">`) || !strings.Contains(s, `<vcpupin vcpu="47" cpuset="121">`) || !strings.Contains(s, `<cache mode="passthrough">`) {
		t.Error("domain lacks per-slot vCPU pinning or cache passthrough")
	}
	for _, want := range []string{`<domain type="kvm">`, `<memory unit="MiB">131072</memory>`, `<vcpu placement="static">48</vcpu>`,
		`<cpu mode="host-passthrough"`, `<hugepages></hugepages>`, `<memory mode="strict" nodeset="0">`, `secure="no"`,
		`<emulatorpin cpuset="0-1,96-97">`, `<iothreadpin iothread="1" cpuset="0-1,96-97">`, `<iothreads>1</iothreads>`,
		`<cell id="0" cpus="0-47" memory="131072" unit="MiB">`, `model="pcie-expander-bus"`,
		`<address domain="0x0000" bus="0x1b" slot="0x00" function="0x0">`, `<address domain="0x0000" bus="0x3a" slot="0x00" function="0x2">`,
		`managed="no"`, `<source dev="/dev/disk/by-id/nvme-eui.0025388b01000002">`, `discard="unmap"`, `<virtualport type="openvswitch">`,
		`<mac address="52:54:00:01:00:00">`, `device="cdrom"`, `<boot order="1">`} {
		if !strings.Contains(s, want) {
			t.Errorf("domain lacks %s", want)
		}
	}
	if strings.Contains(s, "<graphics") {
		t.Error("domain has graphics: console is via the terminal gateway only")
	}
	if n := strings.Count(s, "<hostdev "); n != 4 {
		t.Errorf("%d hostdevs, want 4 (2 GPUs + 2 VFs)", n)
	}
	validate(t, x)
}

func TestLabDomainIsEmulatedWithoutPassthrough(t *testing.T) {
	s := prod()
	s.Emulated, s.OVS, s.LabOffloadOff, s.Hugepages = true, false, true, false
	s.Bridge = "gpuaasbr0"
	s.Bundles = []Bundle{{Disk: "/dev/loop7", NUMANode: numa(0)}}
	s.HousekeepingCPUs = nil
	x, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	str := string(x)
	if !strings.Contains(str, `<domain type="qemu">`) || strings.Contains(str, "<hostdev") || strings.Contains(str, "host-passthrough") ||
		!strings.Contains(str, `csum="off"`) {
		t.Fatalf("lab domain:\n%s", x)
	}
	validate(t, x)
}

func TestBadSpecsRefused(t *testing.T) {
	cases := map[string]func(*Spec){
		"bad name":         func(s *Spec) { s.Name = "a b" },
		"no bundles":       func(s *Spec) { s.Bundles = nil },
		"bad pci":          func(s *Spec) { s.Bundles[0].GPUPCI = "1b:00.0" },
		"disk not /dev":    func(s *Spec) { s.Bundles[0].Disk = "/var/lib/x.img" },
		"disk traversal":   func(s *Spec) { s.Bundles[0].Disk = "/dev/../etc/passwd" },
		"bridge injection": func(s *Spec) { s.Bridge = `br0"/><x a="` },
		"relative seed":    func(s *Spec) { s.SeedISO = "seed.iso" },
		"zero memory":      func(s *Spec) { s.MemoryMiB = 0 },
		"bad mac":          func(s *Spec) { s.MAC = "52:54:00" },
	}
	for name, mut := range cases {
		s := prod()
		mut(&s)
		if _, err := Build(s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Unknown NUMA anywhere: no numatune, guest cells or expander buses rather than wrong ones.
	s := prod()
	s.Bundles[1].NUMANode, s.Bundles[1].MemoryNode = nil, nil
	x, err := Build(s)
	if err != nil || strings.Contains(string(x), "numatune") || strings.Contains(string(x), "<cell") || strings.Contains(string(x), "expander") {
		t.Fatalf("unknown NUMA: %v\n%s", err, x)
	}
	validate(t, x)
}
