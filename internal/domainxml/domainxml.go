// Package domainxml builds the libvirt domain XML of a slice VM from its accepted plan: one
// VM per allocation with N GPU + fabric VF passthrough pairs, N raw NVMe disks (the first
// boots), the NoCloud seed as a CD-ROM, a NIC with the slot's MAC on the host bridge, UEFI
// without Secure Boot, no graphics (console only through the terminal gateway), memory and
// vCPUs summed over the bundles, NUMA-pinned memory (seed 000 "virt-install command shape").
package domainxml

import (
	"encoding/xml"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Bundle is one slot's devices.
type Bundle struct {
	GPUPCI      string // passthrough GPU (omitted in the lab)
	FabricVFPCI string // passthrough fabric VF (omitted in the lab)
	Disk        string // raw block device: the slot NVMe (by-id) or a loop device in the lab
	NUMANode    *int
}

// Spec is everything the domain needs.
type Spec struct {
	Name       string
	UUID       string // optional
	VCPUs      int
	MemoryMiB  int
	Hugepages  bool
	Bundles    []Bundle
	SeedISO    string
	MAC        string
	Bridge     string // host bridge name
	OVS        bool   // bridge is Open vSwitch (production); false = Linux bridge (lab)
	Emulated   bool   // lab: type='qemu' (no KVM), no PCI passthrough
	LoaderPath string // OVMF code, e.g. /usr/share/OVMF/OVMF_CODE_4M.fd
	NVRAMPath  string // per-VM vars file
	// LabOffloadOff turns NIC checksum/segmentation offloads off (LAB.md: OVS netdev
	// datapath drops DHCP and TCP otherwise).
	LabOffloadOff bool
	// PinCPUs are host CPUs for vCPU i (len == VCPUs), derived from the slots' NUMA CPU
	// lists by PinFromCPUList; empty = no pinning.
	PinCPUs []int
	// ConsoleLog, when set, keeps a copy of the serial console in this file (readiness
	// failures quote its tail; the console itself stays pty-only, no graphics).
	ConsoleLog string
}

var (
	pciRE  = regexp.MustCompile(`^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$`)
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$`)
	macRE  = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	ifRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$`)
)

type domain struct {
	XMLName       xml.Name       `xml:"domain"`
	Type          string         `xml:"type,attr"`
	Name          string         `xml:"name"`
	UUID          string         `xml:"uuid,omitempty"`
	Memory        unitValue      `xml:"memory"`
	MemoryBacking *memoryBacking `xml:"memoryBacking,omitempty"`
	VCPU          vcpu           `xml:"vcpu"`
	NUMATune      *numaTune      `xml:"numatune,omitempty"`
	OS            osXML          `xml:"os"`
	Features      features       `xml:"features"`
	CPUTune       *cpuTune       `xml:"cputune,omitempty"`
	CPU           *cpuXML        `xml:"cpu,omitempty"`
	OnPoweroff    string         `xml:"on_poweroff"`
	OnReboot      string         `xml:"on_reboot"`
	OnCrash       string         `xml:"on_crash"`
	Devices       devices        `xml:"devices"`
}

type unitValue struct {
	Unit  string `xml:"unit,attr"`
	Value int    `xml:",chardata"`
}
type memoryBacking struct {
	Hugepages *struct{} `xml:"hugepages,omitempty"`
}
type vcpu struct {
	Placement string `xml:"placement,attr"`
	Value     int    `xml:",chardata"`
}
type numaTune struct {
	Memory struct {
		Mode    string `xml:"mode,attr"`
		Nodeset string `xml:"nodeset,attr"`
	} `xml:"memory"`
}
type osXML struct {
	Firmware string    `xml:"firmware,attr,omitempty"`
	Type     osType    `xml:"type"`
	Loader   *loader   `xml:"loader,omitempty"`
	NVRAM    string    `xml:"nvram,omitempty"`
	Boot     []bootDev `xml:"boot"`
}
type osType struct {
	Arch    string `xml:"arch,attr"`
	Machine string `xml:"machine,attr"`
	Value   string `xml:",chardata"`
}
type loader struct {
	Readonly string `xml:"readonly,attr"`
	Secure   string `xml:"secure,attr"`
	Type     string `xml:"type,attr"`
	Path     string `xml:",chardata"`
}
type bootDev struct {
	Dev string `xml:"dev,attr"`
}
type features struct {
	ACPI *struct{} `xml:"acpi"`
	APIC *struct{} `xml:"apic"`
}
type cpuXML struct {
	Mode  string    `xml:"mode,attr"`
	Check string    `xml:"check,attr,omitempty"`
	Cache *cacheXML `xml:"cache,omitempty"`
}
type cacheXML struct {
	Mode string `xml:"mode,attr"`
}
type cpuTune struct {
	Pins []vcpuPin `xml:"vcpupin"`
}
type vcpuPin struct {
	VCPU   int    `xml:"vcpu,attr"`
	CPUSet string `xml:"cpuset,attr"`
}
type devices struct {
	Controllers []controller `xml:"controller"`
	Disks       []diskXML    `xml:"disk"`
	Interfaces  []iface      `xml:"interface"`
	Hostdevs    []hostdev    `xml:"hostdev"`
	Serial      console      `xml:"serial"`
	Console     console      `xml:"console"`
}
type controller struct {
	Type  string `xml:"type,attr"`
	Index int    `xml:"index,attr"`
	Model string `xml:"model,attr"`
}
type diskXML struct {
	Type     string     `xml:"type,attr"`
	Device   string     `xml:"device,attr"`
	Driver   diskDriver `xml:"driver"`
	Source   diskSource `xml:"source"`
	Target   diskTarget `xml:"target"`
	ReadOnly *struct{}  `xml:"readonly,omitempty"`
	Boot     *bootOrder `xml:"boot,omitempty"`
}
type diskDriver struct {
	Name        string `xml:"name,attr"`
	Type        string `xml:"type,attr"`
	Cache       string `xml:"cache,attr,omitempty"`
	IO          string `xml:"io,attr,omitempty"`
	Discard     string `xml:"discard,attr,omitempty"`
	DetectZeros string `xml:"detect_zeroes,attr,omitempty"`
}
type diskSource struct {
	Dev  string `xml:"dev,attr,omitempty"`
	File string `xml:"file,attr,omitempty"`
}
type diskTarget struct {
	Dev          string `xml:"dev,attr"`
	Bus          string `xml:"bus,attr"`
	RotationRate int    `xml:"rotation_rate,attr,omitempty"`
}
type bootOrder struct {
	Order int `xml:"order,attr"`
}
type iface struct {
	Type        string       `xml:"type,attr"`
	MAC         addrAttr     `xml:"mac"`
	Source      bridgeSource `xml:"source"`
	VirtualPort *virtualPort `xml:"virtualport,omitempty"`
	Model       typeAttr     `xml:"model"`
	Driver      *nicDriver   `xml:"driver,omitempty"`
}
type addrAttr struct {
	Address string `xml:"address,attr"`
}
type bridgeSource struct {
	Bridge string `xml:"bridge,attr"`
}
type virtualPort struct {
	Type string `xml:"type,attr"`
}
type typeAttr struct {
	Type string `xml:"type,attr"`
}
type nicDriver struct {
	Name  string  `xml:"name,attr"`
	Host  offload `xml:"host"`
	Guest offload `xml:"guest"`
}
type offload struct {
	Csum string `xml:"csum,attr"`
	TSO4 string `xml:"tso4,attr"`
	TSO6 string `xml:"tso6,attr"`
	ECN  string `xml:"ecn,attr"`
}
type hostdev struct {
	Mode    string        `xml:"mode,attr"`
	Type    string        `xml:"type,attr"`
	Managed string        `xml:"managed,attr"`
	Source  hostdevSource `xml:"source"`
}
type hostdevSource struct {
	Address pciAddr `xml:"address"`
}
type pciAddr struct {
	Domain   string `xml:"domain,attr"`
	Bus      string `xml:"bus,attr"`
	Slot     string `xml:"slot,attr"`
	Function string `xml:"function,attr"`
}
type console struct {
	Type   string      `xml:"type,attr"`
	Target *consoleTgt `xml:"target,omitempty"`
	Log    *consoleLog `xml:"log,omitempty"`
}
type consoleLog struct {
	File   string `xml:"file,attr"`
	Append string `xml:"append,attr"`
}
type consoleTgt struct {
	Type string `xml:"type,attr,omitempty"`
	Port string `xml:"port,attr,omitempty"`
}

func pci(addr string) (pciAddr, error) {
	m := pciRE.FindStringSubmatch(addr)
	if m == nil {
		return pciAddr{}, fmt.Errorf("domainxml: %q is not a PCI address", addr)
	}
	return pciAddr{Domain: "0x" + m[1], Bus: "0x" + m[2], Slot: "0x" + m[3], Function: "0x" + m[4]}, nil
}

func safePath(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.Contains(p, "..") && !strings.ContainsAny(p, "\x00\n")
}

// Build validates spec and renders the domain XML.
func Build(s Spec) ([]byte, error) {
	switch {
	case !nameRE.MatchString(s.Name):
		return nil, fmt.Errorf("domainxml: name %q", s.Name)
	case s.VCPUs <= 0 || s.VCPUs > 1024 || s.MemoryMiB <= 0:
		return nil, fmt.Errorf("domainxml: vcpus %d / memory %d MiB out of range", s.VCPUs, s.MemoryMiB)
	case len(s.Bundles) == 0:
		return nil, fmt.Errorf("domainxml: no bundles")
	case !macRE.MatchString(s.MAC):
		return nil, fmt.Errorf("domainxml: MAC %q", s.MAC)
	case !ifRE.MatchString(s.Bridge):
		return nil, fmt.Errorf("domainxml: bridge %q", s.Bridge)
	case !safePath(s.SeedISO) || (s.LoaderPath != "" && !safePath(s.LoaderPath)) || (s.NVRAMPath != "" && !safePath(s.NVRAMPath)) || (s.ConsoleLog != "" && !safePath(s.ConsoleLog)):
		return nil, fmt.Errorf("domainxml: seed/loader/nvram paths must be absolute and clean")
	}
	d := domain{Type: "kvm", Name: s.Name, UUID: s.UUID, Memory: unitValue{"MiB", s.MemoryMiB},
		VCPU: vcpu{"static", s.VCPUs}, OnPoweroff: "destroy", OnReboot: "restart", OnCrash: "destroy",
		CPU: &cpuXML{Mode: "host-passthrough", Check: "none", Cache: &cacheXML{Mode: "passthrough"}}, Features: features{ACPI: &struct{}{}, APIC: &struct{}{}}}
	if s.Emulated {
		d.Type, d.CPU = "qemu", nil // no KVM here: software emulation, default CPU model
	}
	if len(s.PinCPUs) > 0 {
		if len(s.PinCPUs) != s.VCPUs {
			return nil, fmt.Errorf("domainxml: %d pinned CPUs for %d vCPUs", len(s.PinCPUs), s.VCPUs)
		}
		d.CPUTune = &cpuTune{}
		for i, c := range s.PinCPUs {
			d.CPUTune.Pins = append(d.CPUTune.Pins, vcpuPin{VCPU: i, CPUSet: strconv.Itoa(c)})
		}
	}
	if s.Hugepages {
		d.MemoryBacking = &memoryBacking{Hugepages: &struct{}{}}
	}
	d.OS.Type = osType{Arch: "x86_64", Machine: "q35", Value: "hvm"}
	if s.LoaderPath != "" {
		d.OS.Loader = &loader{Readonly: "yes", Secure: "no", Type: "pflash", Path: s.LoaderPath}
		d.OS.NVRAM = s.NVRAMPath
	}
	if nodes := numaNodes(s.Bundles); nodes != "" {
		d.NUMATune = &numaTune{}
		d.NUMATune.Memory.Mode, d.NUMATune.Memory.Nodeset = "strict", nodes
	}
	d.Devices.Controllers = []controller{{Type: "scsi", Index: 0, Model: "virtio-scsi"}}
	for i, b := range s.Bundles {
		if !safePath(b.Disk) || !strings.HasPrefix(b.Disk, "/dev/") {
			return nil, fmt.Errorf("domainxml: slot disk %q must be a /dev block device", b.Disk)
		}
		disk := diskXML{Type: "block", Device: "disk",
			Driver: diskDriver{Name: "qemu", Type: "raw", Cache: "none", IO: "native", Discard: "unmap", DetectZeros: "unmap"},
			Source: diskSource{Dev: b.Disk}, Target: diskTarget{Dev: "sd" + string(rune('a'+i)), Bus: "scsi", RotationRate: 1}}
		if i == 0 {
			disk.Boot = &bootOrder{Order: 1}
		}
		d.Devices.Disks = append(d.Devices.Disks, disk)
		if s.Emulated {
			continue // the lab has no devices to pass through; said so in the provision output
		}
		for _, a := range []string{b.GPUPCI, b.FabricVFPCI} {
			addr, err := pci(a)
			if err != nil {
				return nil, err
			}
			// managed='no': hostd keeps GPUs and VFs on vfio-pci itself (seed 001).
			d.Devices.Hostdevs = append(d.Devices.Hostdevs, hostdev{Mode: "subsystem", Type: "pci", Managed: "no", Source: hostdevSource{addr}})
		}
	}
	d.Devices.Disks = append(d.Devices.Disks, diskXML{Type: "file", Device: "cdrom", Driver: diskDriver{Name: "qemu", Type: "raw"},
		Source: diskSource{File: s.SeedISO}, Target: diskTarget{Dev: "sd" + string(rune('a'+len(s.Bundles))), Bus: "sata"}, ReadOnly: &struct{}{}})
	nic := iface{Type: "bridge", MAC: addrAttr{s.MAC}, Source: bridgeSource{s.Bridge}, Model: typeAttr{"virtio"}}
	if s.OVS {
		nic.VirtualPort = &virtualPort{Type: "openvswitch"}
	}
	if s.LabOffloadOff {
		nic.Driver = &nicDriver{Name: "qemu", Host: offload{"off", "off", "off", "off"}, Guest: offload{"off", "off", "off", "off"}}
	}
	d.Devices.Interfaces = []iface{nic}
	d.Devices.Serial = console{Type: "pty", Target: &consoleTgt{Port: "0"}}
	if s.ConsoleLog != "" {
		d.Devices.Serial.Log = &consoleLog{File: s.ConsoleLog, Append: "off"}
	}
	d.Devices.Console = console{Type: "pty", Target: &consoleTgt{Type: "serial", Port: "0"}}
	out, err := xml.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// numaNodes is the sorted, de-duplicated NUMA nodeset of the bundles ("" if any is unknown).
func numaNodes(bs []Bundle) string {
	seen := map[int]bool{}
	var nodes []string
	for _, b := range bs {
		if b.NUMANode == nil {
			return ""
		}
		if !seen[*b.NUMANode] {
			seen[*b.NUMANode] = true
			nodes = append(nodes, strconv.Itoa(*b.NUMANode))
		}
	}
	return strings.Join(nodes, ",")
}

// PinFromCPUList picks n host CPUs from NUMA CPU lists (sysfs form "0-47,96-143"), in order,
// taking from each slot's NUMA list in turn, so vCPUs land on the GPUs' NUMA nodes. It fails
// when the lists hold fewer than n CPUs rather than over-subscribing silently.
func PinFromCPUList(lists []string, n int) ([]int, error) {
	seen := map[int]bool{}
	var all []int
	for _, l := range lists {
		for _, part := range strings.Split(strings.TrimSpace(l), ",") {
			if part == "" {
				continue
			}
			lo, hi, isRange := strings.Cut(part, "-")
			a, err := strconv.Atoi(lo)
			if err != nil {
				return nil, fmt.Errorf("domainxml: cpu list %q", l)
			}
			b := a
			if isRange {
				if b, err = strconv.Atoi(hi); err != nil || b < a {
					return nil, fmt.Errorf("domainxml: cpu list %q", l)
				}
			}
			for c := a; c <= b; c++ {
				if !seen[c] {
					seen[c] = true
					all = append(all, c)
				}
			}
		}
	}
	if len(all) < n {
		return nil, fmt.Errorf("domainxml: %d vCPUs requested but the slots' NUMA nodes have %d CPUs", n, len(all))
	}
	return all[:n], nil
}
