package domainxml

import (
	"fmt"
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
			{GPUPCI: "0000:1b:00.0", FabricVFPCI: "0000:1a:00.2", Disk: "/dev/disk/by-id/nvme-eui.0025388b01000001", NUMANode: numa(0)},
			{GPUPCI: "0000:3c:00.0", FabricVFPCI: "0000:3a:00.2", Disk: "/dev/disk/by-id/nvme-eui.0025388b01000002", NUMANode: numa(0)},
		},
		SeedISO: "/var/lib/gpuaas/slices/0c989b43/seed.iso", MAC: "52:54:00:01:00:00", Bridge: "ovsbr0", OVS: true,
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

func TestProductionDomain(t *testing.T) {
	spec := prod()
	pins, err := PinFromCPUList([]string{"0-23,96-119"}, 48)
	if err != nil {
		t.Fatal(err)
	}
	spec.PinCPUs = pins
	x, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	s := string(x)
	if !strings.Contains(s, `<vcpupin vcpu="0" cpuset="0">`) || !strings.Contains(s, `<vcpupin vcpu="47" cpuset="119">`) || !strings.Contains(s, `<cache mode="passthrough">`) {
		t.Error("domain lacks NUMA-derived vCPU pinning or cache passthrough")
	}
	for _, want := range []string{`<domain type="kvm">`, `<memory unit="MiB">131072</memory>`, `<vcpu placement="static">48</vcpu>`,
		`<cpu mode="host-passthrough"`, `<hugepages></hugepages>`, `nodeset="0"`, `secure="no"`,
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
	// Unknown NUMA anywhere: no numatune rather than a wrong one.
	s := prod()
	s.Bundles[1].NUMANode = nil
	x, err := Build(s)
	if err != nil || strings.Contains(string(x), "numatune") {
		t.Fatalf("unknown NUMA: %v", err)
	}
}

func TestPinFromCPUList(t *testing.T) {
	got, err := PinFromCPUList([]string{"0-2,8", "4-5"}, 5)
	if err != nil || fmt.Sprint(got) != "[0 1 2 8 4]" {
		t.Fatalf("pins = %v %v", got, err)
	}
	if _, err := PinFromCPUList([]string{"0-3"}, 24); err == nil {
		t.Fatal("over-subscription accepted")
	}
	if _, err := PinFromCPUList([]string{"3-1"}, 1); err == nil {
		t.Fatal("bad range accepted")
	}
}
