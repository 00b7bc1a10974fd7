// Package domainxml builds the libvirt domain XML of a slice VM from its accepted plan: one
// VM per allocation with N GPU + fabric VF passthrough pairs, N raw NVMe disks (the first
// boots), the NoCloud seed as a CD-ROM, a NIC with the slot's MAC on the host bridge, UEFI
// without Secure Boot, no graphics (console only through the terminal gateway), memory and
// vCPUs summed over the bundles (seed 000 "virt-install command shape"). Each slot's vCPUs are
// pinned one to one onto the slot's own host CPUs, the emulator and I/O threads onto the host's
// housekeeping CPUs, and memory strictly to the slots' NUMA nodes; the guest gets one NUMA cell
// per host node its slots sit on, and each slot's devices hang under a PCIe expander bus bound
// to that cell (layout.go), so the guest sees which GPU and disk are near which vCPUs.
package domainxml

import (
	"encoding/xml"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Bundle is one slot's devices and its share of the VM.
type Bundle struct {
	GPUPCI      string // passthrough GPU (omitted in the lab)
	FabricVFPCI string // passthrough fabric VF (omitted in the lab)
	Disk        string // raw block device: the slot NVMe (by-id) or a loop device in the lab
	// Serial is the disk's serial as the guest reads it (the slot's name for its disk);
	// optional.
	Serial string
	// NUMANode is the slot's NUMA node: its guest cell. nil anywhere = unknown: no guest cells,
	// no expander buses, no memory binding (rather than a wrong one).
	NUMANode *int
	// MemoryNode is the host node the slot's cell memory is bound to (strict): NUMANode, or nil
	// where the host lacks that node (the lab only).
	MemoryNode *int
	// VCPUs and MemoryMiB are the slot's share of the VM; all zero = Spec's totals split evenly.
	VCPUs     int
	MemoryMiB int
	// CPUs are the slot's host CPUs: its vCPUs are pinned one to one onto the first VCPUs of
	// them. Fewer CPUs than vCPUs is refused; empty = the slot's vCPUs are not pinned.
	CPUs []int
}

// Spec is everything the domain needs.
type Spec struct {
	Name      string
	UUID      string // optional
	VCPUs     int
	MemoryMiB int
	Hugepages bool
	Bundles   []Bundle
	SeedISO   string
	MAC       string
	Bridge    string // host bridge name
	OVS       bool   // bridge is Open vSwitch (production); false = Linux bridge (lab)
	Emulated  bool   // lab: type='qemu' (no KVM), no PCI passthrough
	// SoftwareCPU: type='qemu' with the default CPU model, passthrough kept (the lab host VM:
	// an emulated IOMMU and devices, no KVM).
	SoftwareCPU bool
	LoaderPath  string // OVMF code, e.g. /usr/share/OVMF/OVMF_CODE_4M.fd
	NVRAMPath   string // per-VM vars file
	// LabOffloadOff turns NIC checksum/segmentation offloads off (LAB.md: OVS netdev
	// datapath drops DHCP and TCP otherwise).
	LabOffloadOff bool
	// HousekeepingCPUs take the emulator and I/O threads, off every slot's CPUs; empty = not
	// pinned.
	HousekeepingCPUs []int
	// ConsoleLog, when set, keeps a copy of the serial console in this file (readiness
	// failures quote its tail; the console itself stays pty-only, no graphics).
	ConsoleLog string
}

var (
	pciRE  = regexp.MustCompile(`^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$`)
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$`)
	macRE  = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	// serialRE is what libvirt's schema and a SCSI unit serial both take.
	serialRE = regexp.MustCompile(`^[A-Za-z0-9._+-]{1,20}$`)
	ifRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$`)
)

type domain struct {
	XMLName       xml.Name       `xml:"domain"`
	Type          string         `xml:"type,attr"`
	Name          string         `xml:"name"`
	UUID          string         `xml:"uuid,omitempty"`
	Memory        unitValue      `xml:"memory"`
	MemoryBacking *memoryBacking `xml:"memoryBacking,omitempty"`
	VCPU          vcpu           `xml:"vcpu"`
	IOThreads     int            `xml:"iothreads,omitempty"`
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
	Memnodes []memnode `xml:"memnode"`
}
type memnode struct {
	CellID  int    `xml:"cellid,attr"`
	Mode    string `xml:"mode,attr"`
	Nodeset string `xml:"nodeset,attr"`
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
	Mode  string    `xml:"mode,attr,omitempty"`
	Check string    `xml:"check,attr,omitempty"`
	Cache *cacheXML `xml:"cache,omitempty"`
	NUMA  *numaXML  `xml:"numa,omitempty"`
}
type numaXML struct {
	Cells []cellXML `xml:"cell"`
}
type cellXML struct {
	ID     int    `xml:"id,attr"`
	CPUs   string `xml:"cpus,attr"`
	Memory int    `xml:"memory,attr"`
	Unit   string `xml:"unit,attr"`
}
type cacheXML struct {
	Mode string `xml:"mode,attr"`
}
type cpuTune struct {
	Pins        []vcpuPin     `xml:"vcpupin"`
	EmulatorPin *cpusetAttr   `xml:"emulatorpin,omitempty"`
	IOThreadPin []iothreadPin `xml:"iothreadpin"`
}
type cpusetAttr struct {
	CPUSet string `xml:"cpuset,attr"`
}
type iothreadPin struct {
	IOThread int    `xml:"iothread,attr"`
	CPUSet   string `xml:"cpuset,attr"`
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
	Type    string      `xml:"type,attr"`
	Index   int         `xml:"index,attr"`
	Model   string      `xml:"model,attr"`
	Driver  *ctlDriver  `xml:"driver,omitempty"`
	Target  *ctlTarget  `xml:"target,omitempty"`
	Address *devAddress `xml:"address,omitempty"`
}
type ctlDriver struct {
	IOThread int `xml:"iothread,attr"`
}
type ctlTarget struct {
	BusNr int `xml:"busNr,attr"`
	Node  int `xml:"node"`
}

// devAddress is a device's place in the guest: a PCI slot (type pci) or a SCSI unit (drive).
type devAddress struct {
	Type       string `xml:"type,attr"`
	Domain     string `xml:"domain,attr,omitempty"`
	Bus        string `xml:"bus,attr"`
	Slot       string `xml:"slot,attr,omitempty"`
	Function   string `xml:"function,attr,omitempty"`
	Controller string `xml:"controller,attr,omitempty"`
	Target     string `xml:"target,attr,omitempty"`
	Unit       string `xml:"unit,attr,omitempty"`
}
type diskXML struct {
	Type     string      `xml:"type,attr"`
	Device   string      `xml:"device,attr"`
	Driver   diskDriver  `xml:"driver"`
	Source   diskSource  `xml:"source"`
	Target   diskTarget  `xml:"target"`
	Serial   string      `xml:"serial,omitempty"`
	ReadOnly *struct{}   `xml:"readonly,omitempty"`
	Boot     *bootOrder  `xml:"boot,omitempty"`
	Address  *devAddress `xml:"address,omitempty"`
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
	Address *devAddress   `xml:"address,omitempty"`
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
	lay, err := plan(s)
	if err != nil {
		return nil, err
	}
	d := domain{Type: "kvm", Name: s.Name, UUID: s.UUID, Memory: unitValue{"MiB", s.MemoryMiB},
		VCPU: vcpu{"static", s.VCPUs}, IOThreads: 1, OnPoweroff: "destroy", OnReboot: "restart", OnCrash: "destroy",
		CPU: &cpuXML{Mode: "host-passthrough", Check: "none", Cache: &cacheXML{Mode: "passthrough"}}, Features: features{ACPI: &struct{}{}, APIC: &struct{}{}}}
	if s.Emulated || s.SoftwareCPU {
		d.Type, d.CPU = "qemu", nil // no KVM here: software emulation, default CPU model
	}
	d.CPUTune = lay.cpuTune()
	if len(lay.cells) > 0 {
		if d.CPU == nil {
			d.CPU = &cpuXML{}
		}
		d.CPU.NUMA = lay.guestCells()
		d.NUMATune = lay.numaTune()
	}
	if s.Hugepages {
		d.MemoryBacking = &memoryBacking{Hugepages: &struct{}{}}
	}
	d.OS.Type = osType{Arch: "x86_64", Machine: "q35", Value: "hvm"}
	if s.LoaderPath != "" {
		d.OS.Loader = &loader{Readonly: "yes", Secure: "no", Type: "pflash", Path: s.LoaderPath}
		d.OS.NVRAM = s.NVRAMPath
	}
	d.Devices.Controllers = lay.busControllers()
	for i, b := range s.Bundles {
		if !safePath(b.Disk) || !strings.HasPrefix(b.Disk, "/dev/") {
			return nil, fmt.Errorf("domainxml: slot disk %q must be a /dev block device", b.Disk)
		}
		if b.Serial != "" && !serialRE.MatchString(b.Serial) {
			return nil, fmt.Errorf("domainxml: disk serial %q", b.Serial)
		}
		// One virtio-scsi controller per slot disk, on the slot's expander bus, served by the
		// I/O thread (pinned to the housekeeping CPUs).
		d.Devices.Controllers = append(d.Devices.Controllers, controller{Type: "scsi", Index: i, Model: "virtio-scsi",
			Driver: &ctlDriver{IOThread: 1}, Address: lay.port(i, 0)})
		disk := diskXML{Type: "block", Device: "disk",
			Driver: diskDriver{Name: "qemu", Type: "raw", Cache: "none", IO: "native", Discard: "unmap", DetectZeros: "unmap"},
			Source: diskSource{Dev: b.Disk}, Target: diskTarget{Dev: "sd" + string(rune('a'+i)), Bus: "scsi", RotationRate: 1}, Serial: b.Serial,
			Address: &devAddress{Type: "drive", Controller: strconv.Itoa(i), Bus: "0", Target: "0", Unit: "0"}}
		if i == 0 {
			disk.Boot = &bootOrder{Order: 1}
		}
		d.Devices.Disks = append(d.Devices.Disks, disk)
		if s.Emulated {
			continue // the lab has no devices to pass through; said so in the provision output
		}
		for j, a := range []string{b.GPUPCI, b.FabricVFPCI} {
			addr, err := pci(a)
			if err != nil {
				return nil, err
			}
			// managed='no': hostd keeps GPUs and VFs on vfio-pci itself (seed 001).
			d.Devices.Hostdevs = append(d.Devices.Hostdevs, hostdev{Mode: "subsystem", Type: "pci", Managed: "no", Source: hostdevSource{addr},
				Address: lay.port(i, 1+j)})
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
