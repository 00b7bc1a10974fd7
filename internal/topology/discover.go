package topology

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/cpuset"
	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/task"
)

const pciDevs = "/sys/bus/pci/devices"

// pciAddrRE is a PCI function address as sysfs names it (domains beyond 0xffff exist, e.g.
// VMD). Names and link targets that are not addresses are never trusted as devices: they
// would end up in sysfs paths and slot maps.
var pciAddrRE = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// Vendor ids.
const (
	vendorNVIDIA   = "0x10de"
	vendorAMD      = "0x1002"
	vendorMellanox = "0x15b3"
)

// The lab host's stand-ins (internal/labhost), recognised only with Options.LabStandIns:
// QEMU's bochs-display stands in for a GPU, and a QEMU NVMe controller that offers SR-IOV
// VFs (and holds no namespace) for the fabric NIC whose VFs slots get.
const (
	LabGPUStandIn    = "1234:1111"
	LabFabricStandIn = "1b36:0010"
	// LabStandInModel names a stand-in GPU in reports: never mistaken for a real one.
	LabStandInModel = "lab stand-in (QEMU bochs-display), not a GPU"
	// LabFabric is the fabric kind of a stand-in fabric device.
	LabFabric = "lab-standin"
)

// Options change what Discover recognises.
type Options struct {
	// LabStandIns recognises the lab host's emulated devices as GPUs and fabric. Only a
	// host enrolled as a lab host sets it, and the controller records such a host as
	// simulated: its stand-ins are never sold as real capacity.
	LabStandIns bool
	// VFIORebind says hostd rebinds GPUs and VFs to vfio-pci itself when it provisions
	// (GPUAAS_SLICE_RUNTIME_VFIO_BIND): a GPU on its native driver then does not block its
	// candidate slot.
	VFIORebind bool
}

type scanner struct {
	opt  Options
	fs   hostfs.FS
	run  hostfs.Runner     // signature probes (wipefs, blkid)
	ids  map[string]string // "10de:2335" -> model
	warn []string
}

func (s *scanner) read(p string) string {
	b, err := s.fs.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (s *scanner) readInt(p string) (int, bool) {
	v, err := strconv.Atoi(s.read(p))
	return v, err == nil
}

// numa reads a device's numa_node; -1 or unreadable is unknown (nil).
func (s *scanner) numa(dir string) *int {
	n, ok := s.readInt(dir + "/numa_node")
	if !ok || n < 0 {
		return nil
	}
	return &n
}

// pciLink is the PCI address a sysfs link points at, "" when it names none.
func (s *scanner) pciLink(p string) string {
	if a := s.fs.LinkBase(p); pciAddrRE.MatchString(a) {
		return a
	}
	return ""
}

func (s *scanner) driver(dir string) string {
	if d := s.fs.LinkBase(dir + "/driver"); d != "" {
		return d
	}
	return "none"
}

// Discover reads the host through fs and builds the report with candidates.
func Discover(fs hostfs.FS) (*Report, error) { return DiscoverWith(fs, Options{}) }

// DiscoverWith is Discover with options.
func DiscoverWith(fs hostfs.FS, opt Options) (*Report, error) {
	s := &scanner{opt: opt, fs: fs, run: hostfs.Exec{}, ids: loadPCIIDs(fs)}
	entries, err := fs.ReadDir(pciDevs)
	if err != nil {
		return nil, fmt.Errorf("topology: cannot read %s: %w", pciDevs, err)
	}
	r := &Report{GPUs: []GPU{}, NVMe: []NVMe{}, Fabric: []Fabric{}, NUMA: []NUMANode{}, Net: []NetDev{}}
	vfOf := map[string]bool{}
	for _, e := range entries {
		addr := e.Name()
		if !pciAddrRE.MatchString(addr) {
			s.warn = append(s.warn, fmt.Sprintf("%s/%q is not a PCI address: ignored", pciDevs, addr))
			continue
		}
		dir := pciDevs + "/" + addr
		vendor, class := s.read(dir+"/vendor"), s.read(dir+"/class")
		id := strings.TrimPrefix(vendor, "0x") + ":" + strings.TrimPrefix(s.read(dir+"/device"), "0x")
		switch {
		case opt.LabStandIns && id == LabGPUStandIn:
			r.GPUs = append(r.GPUs, s.gpu(addr, dir, vendor))
		case opt.LabStandIns && id == LabFabricStandIn && s.fs.Exists(dir+"/physfn"):
			vfOf[addr] = true
		case opt.LabStandIns && id == LabFabricStandIn && s.read(dir+"/sriov_totalvfs") != "" && s.read(dir+"/sriov_totalvfs") != "0":
			f := s.fabric(addr, dir)
			f.Fabric = LabFabric
			r.Fabric = append(r.Fabric, f)
		case (vendor == vendorNVIDIA || vendor == vendorAMD) && (strings.HasPrefix(class, "0x0300") || strings.HasPrefix(class, "0x0302")):
			r.GPUs = append(r.GPUs, s.gpu(addr, dir, vendor))
		case vendor == vendorMellanox && s.fs.Exists(dir+"/physfn"):
			vfOf[addr] = true // a VF: listed under its parent
		case vendor == vendorMellanox:
			r.Fabric = append(r.Fabric, s.fabric(addr, dir))
		}
	}
	sort.Slice(r.GPUs, func(i, j int) bool { return r.GPUs[i].PCIAddress < r.GPUs[j].PCIAddress })
	sort.Slice(r.Fabric, func(i, j int) bool { return r.Fabric[i].PCIAddress < r.Fabric[j].PCIAddress })
	r.NVMe = s.nvme()
	r.NUMA = s.numaNodes()
	r.Net = s.netdevs()
	s.rdma(r.Fabric)
	r.LabStandIns = opt.LabStandIns
	r.Candidates = candidates(r, opt)
	r.Warnings = s.warn
	return r, nil
}

func (s *scanner) gpu(addr, dir, vendor string) GPU {
	dev := s.read(dir + "/device")
	g := GPU{PCIAddress: addr, VendorID: vendor, DeviceID: dev, NUMANode: s.numa(dir), LocalCPUs: s.read(dir + "/local_cpulist"),
		Driver: s.driver(dir), Model: s.model(vendor, dev)}
	if grp := s.fs.LinkBase(dir + "/iommu_group"); grp != "" {
		if n, err := strconv.Atoi(grp); err == nil && n >= 0 {
			g.IOMMUGroup = &n
			peers, _ := s.fs.ReadDir("/sys/kernel/iommu_groups/" + grp + "/devices")
			for _, p := range peers {
				if p.Name() != addr {
					g.IOMMUPeers = append(g.IOMMUPeers, p.Name())
				}
			}
			sort.Strings(g.IOMMUPeers)
		}
	}
	return g
}

func (s *scanner) model(vendor, dev string) string {
	key := strings.TrimPrefix(vendor, "0x") + ":" + strings.TrimPrefix(dev, "0x")
	if s.opt.LabStandIns && key == LabGPUStandIn {
		return LabStandInModel
	}
	if m, ok := s.ids[key]; ok {
		return m
	}
	if m, ok := knownModels[key]; ok {
		return m
	}
	return "unknown (" + key + ")"
}

func (s *scanner) fabric(addr, dir string) Fabric {
	f := Fabric{PCIAddress: addr, VendorID: s.read(dir + "/vendor"), DeviceID: s.read(dir + "/device"), NUMANode: s.numa(dir),
		Driver: s.driver(dir), Fabric: "unknown"}
	f.SRIOVTotal, _ = s.readInt(dir + "/sriov_totalvfs")
	f.SRIOVNum, _ = s.readInt(dir + "/sriov_numvfs")
	links, _ := s.fs.Glob(dir + "/virtfn*")
	sort.Slice(links, func(i, j int) bool { return vfIndex(links[i]) < vfIndex(links[j]) })
	for _, l := range links {
		if vf := s.pciLink(l); vf != "" {
			f.VFs = append(f.VFs, vf)
			f.VFDrivers = append(f.VFDrivers, s.driver(pciDevs+"/"+vf))
		}
	}
	return f
}

func vfIndex(p string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(path.Base(p), "virtfn"))
	return n
}

// rdma attaches /sys/class/infiniband devices (ports, link layer, GUID) to their PCI parents.
func (s *scanner) rdma(fab []Fabric) {
	devs, _ := s.fs.ReadDir("/sys/class/infiniband")
	byPCI := map[string]*Fabric{}
	for i := range fab {
		byPCI[fab[i].PCIAddress] = &fab[i]
	}
	for _, d := range devs {
		base := "/sys/class/infiniband/" + d.Name()
		f, ok := byPCI[s.pciLink(base+"/device")]
		if !ok {
			continue
		}
		f.RDMADevice, f.NodeGUID = d.Name(), s.read(base+"/node_guid")
		ports, _ := s.fs.ReadDir(base + "/ports")
		for _, p := range ports {
			n, _ := strconv.Atoi(p.Name())
			pb := base + "/ports/" + p.Name()
			port := Port{Port: n, State: s.read(pb + "/state"), PhysState: s.read(pb + "/phys_state"),
				LinkLayer: s.read(pb + "/link_layer"), Rate: s.read(pb + "/rate")}
			f.Ports = append(f.Ports, port)
			switch port.LinkLayer {
			case "InfiniBand":
				f.Fabric = "infiniband"
			case "Ethernet":
				f.Fabric = "roce"
			}
		}
	}
}

// nvme lists namespaces with stable identity, partitions, mounts, signatures and the OS disk.
func (s *scanner) nvme() []NVMe {
	mounts := s.mounts()
	byID := s.byID()
	blocks, _ := s.fs.Glob("/sys/block/nvme*n*")
	out := []NVMe{}
	for _, b := range blocks {
		ns := path.Base(b)
		ctrl := ns[:strings.LastIndex(ns, "n")]
		cdir := "/sys/class/nvme/" + ctrl
		pci := s.pciLink(cdir + "/device")
		n := NVMe{Controller: ctrl, Namespace: ns, PCIAddress: pci, ByID: byID[ns]}
		if pci != "" {
			n.NUMANode = s.numa(pciDevs + "/" + pci)
		}
		if sectors, err := strconv.ParseInt(s.read(b+"/size"), 10, 64); err == nil {
			n.SizeBytes = sectors * 512
		}
		parts, _ := s.fs.Glob(b + "/" + ns + "p*")
		for _, p := range parts {
			n.Partitions = append(n.Partitions, path.Base(p))
		}
		sort.Strings(n.Partitions)
		for _, dev := range append([]string{ns}, n.Partitions...) {
			for _, mp := range mounts["/dev/"+dev] {
				n.Mounts = append(n.Mounts, mp)
				if mp == "/" || mp == "/boot" || mp == "/boot/efi" {
					n.OSDisk = true
				}
			}
		}
		n.Signature, n.SignatureError = s.signature("/dev/" + ns)
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PCIAddress != out[j].PCIAddress {
			return out[i].PCIAddress < out[j].PCIAddress
		}
		return out[i].Namespace < out[j].Namespace
	})
	return out
}

// mounts maps a source device to its mount points (/proc/mounts).
func (s *scanner) mounts() map[string][]string {
	out := map[string][]string{}
	b, err := s.fs.ReadFile("/proc/mounts")
	if err != nil {
		s.warn = append(s.warn, "cannot read /proc/mounts: mount state unknown")
		return out
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && strings.HasPrefix(f[0], "/dev/") {
			out[f[0]] = append(out[f[0]], f[1])
		}
	}
	return out
}

// byID picks each namespace's stable name from /dev/disk/by-id: EUI, then NGUID/UUID/WWN,
// then model+serial. Partition links are ignored. A bare /dev/nvmeXnY is never an identity.
func (s *scanner) byID() map[string]string {
	links, _ := s.fs.ReadDir("/dev/disk/by-id")
	rank := func(name string) int {
		switch {
		case strings.HasPrefix(name, "nvme-eui."):
			return 0
		case strings.HasPrefix(name, "nvme-uuid."), strings.HasPrefix(name, "nvme-nguid."), strings.HasPrefix(name, "wwn-"):
			return 1
		case strings.HasPrefix(name, "nvme-"):
			return 2
		}
		return 9
	}
	best := map[string]string{}
	for _, l := range links {
		name := l.Name()
		if strings.Contains(name, "-part") || rank(name) == 9 || task.CheckByIDPath("/dev/disk/by-id/"+name) != nil {
			continue
		}
		target := s.fs.LinkBase("/dev/disk/by-id/" + name)
		if !strings.HasPrefix(target, "nvme") {
			continue
		}
		cur, ok := best[target]
		if !ok || rank(name) < rank(path.Base(cur)) || (rank(name) == rank(path.Base(cur)) && name < path.Base(cur)) {
			best[target] = "/dev/disk/by-id/" + name
		}
	}
	return best
}

// probeTimeout bounds one device's signature probe: a dying disk must not hang discovery.
const probeTimeout = 30 * time.Second

// signature names what dev holds by probing it (disk.Probe: every filesystem, partition table,
// LVM PV, LUKS header, RAID and ZFS member libblkid knows, wherever on the device it sits).
// A probe that fails is reported as such, never as "no signature".
func (s *scanner) signature(dev string) (sig, probeErr string) {
	full, err := s.fs.Path(dev)
	if err != nil {
		return "", err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	sigs, err := disk.Probe(ctx, s.run, full)
	if err != nil {
		s.warn = append(s.warn, err.Error())
		return "", err.Error()
	}
	return disk.Describe(sigs), ""
}

func (s *scanner) numaNodes() []NUMANode {
	nodes, _ := s.fs.Glob("/sys/devices/system/node/node[0-9]*")
	out := []NUMANode{}
	for _, n := range nodes {
		id, err := strconv.Atoi(strings.TrimPrefix(path.Base(n), "node"))
		if err != nil {
			continue
		}
		nn := NUMANode{Node: id, CPUs: s.read(n + "/cpulist")}
		nn.Cores = s.cores(nn.CPUs)
		nn.Hugepages1GTotal, _ = s.readInt(n + "/hugepages/hugepages-1048576kB/nr_hugepages")
		nn.Hugepages1GFree, _ = s.readInt(n + "/hugepages/hugepages-1048576kB/free_hugepages")
		out = append(out, nn)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// cores groups a NUMA node's CPUs into SMT sibling groups. Sibling lists are trusted only
// within the node and only for CPUs not yet grouped, so the groups always partition the node's
// CPUs, whatever sysfs says; an unreadable or malformed list makes the CPU a core alone.
func (s *scanner) cores(cpulist string) []string {
	cpus, err := cpuset.Parse(cpulist)
	if err != nil {
		if cpulist != "" {
			s.warn = append(s.warn, fmt.Sprintf("NUMA CPU list %q: %v", cpulist, err))
		}
		return nil
	}
	inNode := map[int]bool{}
	for _, c := range cpus {
		inNode[c] = true
	}
	grouped := map[int]bool{}
	var out []string
	for _, c := range cpus {
		if grouped[c] {
			continue
		}
		dir := fmt.Sprintf("/sys/devices/system/cpu/cpu%d/topology/", c)
		list := s.read(dir + "core_cpus_list")
		if list == "" {
			list = s.read(dir + "thread_siblings_list")
		}
		sib, err := cpuset.Parse(list)
		if err != nil {
			sib = nil
		}
		group := []int{c}
		for _, o := range sib {
			if o != c && inNode[o] && !grouped[o] {
				group = append(group, o)
			}
		}
		for _, o := range group {
			grouped[o] = true
		}
		out = append(out, cpuset.Format(group))
	}
	return out
}

func (s *scanner) netdevs() []NetDev {
	devs, _ := s.fs.ReadDir("/sys/class/net")
	out := []NetDev{}
	for _, d := range devs {
		if d.Name() == "lo" {
			continue
		}
		base := "/sys/class/net/" + d.Name()
		out = append(out, NetDev{Name: d.Name(), MAC: s.read(base + "/address"), PCIAddress: s.pciLink(base + "/device")})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
