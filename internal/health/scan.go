package health

import (
	"context"
	"errors"
	"io"
	"os"
	"sort"
	"strings"
	"syscall"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// Scanner reads a host's device health through its root, one Scan at a time, and remembers
// what it read last so counters are compared with the previous reading and a lasting
// condition (a downtrained link) is reported once, when it appears, not every scan.
type Scanner struct {
	FS hostfs.FS
	// Run runs nvidia-smi; nil skips it (GPUs on vfio-pci cannot be asked anyway).
	Run hostfs.Runner

	prev     map[string]PCIe
	nvmePCI  map[string]nvmeFunction // NVMe controllers' PCI functions seen, by address
	reported map[string]bool         // device+signal of lasting conditions reported and still present
	kmsgSeen int                     // lines of a regular-file kernel log already read
	kmsg     *os.File                // /dev/kmsg, open between scans
	smart    map[string]SmartLog
}

// lasting signals hold while the condition holds; the others are events (an increase, an Xid).
var lasting = map[string]bool{"pcie:absent": true, "pcie:config_space_unreadable": true, "pcie:link_downtrained": true,
	"pcie:driver_unexpected": true, "gpu:ecc_uncorrectable": true, "gpu:remapped_rows_pending": true,
	"gpu:remapped_rows_failure": true, "gpu:retired_pages_pending": true, "gpu:thermal_slowdown": true,
	"nvme:critical_warning": true, "nvme:spare_below_threshold": true, "nvme:worn_out": true}

// Functions are the PCI functions a scan reads: NVIDIA display/3D controllers (GPUs) and SR-IOV
// virtual functions of Mellanox adapters (the slots' fabric VFs).
func (s *Scanner) Functions() []string {
	devs, _ := s.FS.ReadDir("/sys/bus/pci/devices")
	var out []string
	for _, d := range devs {
		dir := "/sys/bus/pci/devices/" + d.Name()
		vendor, _ := s.FS.ReadFile(dir + "/vendor")
		class, _ := s.FS.ReadFile(dir + "/class")
		v, c := strings.TrimSpace(string(vendor)), strings.TrimSpace(string(class))
		switch {
		case v == "0x10de" && strings.HasPrefix(c, "0x03"):
			out = append(out, d.Name())
		case v == "0x15b3" && s.FS.Exists(dir+"/physfn"):
			out = append(out, d.Name())
		}
	}
	return out
}

// Scan reads every watched function, the kernel log's new Xid lines and, where Run is set and
// nvidia-smi answers, the GPUs the host's driver holds. It returns the new findings.
func (s *Scanner) Scan(ctx context.Context) []Finding {
	if s.prev == nil {
		s.prev, s.reported, s.smart, s.nvmePCI = map[string]PCIe{}, map[string]bool{}, map[string]SmartLog{}, map[string]nvmeFunction{}
	}
	var out []Finding
	present := map[string]bool{}
	keep := func(f Finding) {
		key := f.PCIAddress + f.NVMeDevice + " " + f.Signal
		if lasting[f.Signal] {
			present[key] = true
			if s.reported[key] {
				return
			}
		}
		out = append(out, f)
	}
	for _, addr := range s.Functions() {
		r := ReadPCIe(s.FS, addr)
		var prev *PCIe
		if p, ok := s.prev[addr]; ok {
			prev = &p
		}
		for _, f := range r.Findings(prev, "") {
			keep(f)
		}
		s.prev[addr] = r
	}
	for addr := range s.prev { // watched before, gone from sysfs now
		if !s.FS.Exists("/sys/bus/pci/devices/" + addr) {
			for _, f := range (PCIe{Addr: addr}).Findings(nil, "") {
				keep(f)
			}
		}
	}
	for _, f := range s.nvmePCIe() {
		keep(f)
	}
	for _, f := range XidFindings(s.kernelLog()) {
		keep(f)
	}
	if s.Run != nil {
		for _, f := range s.nvmeFindings(ctx) {
			keep(f)
		}
		if b, err := s.Run.Run(ctx, "nvidia-smi", "-q", "-x"); err == nil {
			if gpus, err := ParseNvidiaSMI(b); err == nil {
				for _, g := range gpus {
					for _, f := range g.Findings() {
						keep(f)
					}
				}
			}
		}
	}
	s.reported = present
	return out
}

// Close releases the kernel log.
func (s *Scanner) Close() {
	if s.kmsg != nil {
		_ = s.kmsg.Close()
		s.kmsg = nil
	}
}

// kernelLog returns the kernel log records written since the last scan: /dev/kmsg read
// without blocking until it has no more (one record a read), or, where the host root holds a
// regular file there (fixture trees), its lines past those already read.
func (s *Scanner) kernelLog() string {
	p, err := s.FS.Path("/dev/kmsg")
	if err != nil {
		return ""
	}
	st, err := os.Stat(p)
	if err != nil {
		return ""
	}
	if st.Mode().IsRegular() {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if s.kmsgSeen > len(lines) {
			s.kmsgSeen = 0
		}
		out := strings.Join(lines[s.kmsgSeen:], "\n")
		s.kmsgSeen = len(lines)
		return out
	}
	if s.kmsg == nil {
		// Opened once and kept: each reader of /dev/kmsg has its own position. It starts at
		// the end of the ring buffer (SEEK_END), so a restart does not report the boot's Xids
		// again.
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return ""
		}
		_, _ = f.Seek(0, io.SeekEnd)
		s.kmsg = f
	}
	f := s.kmsg
	var b strings.Builder
	buf := make([]byte, 8192)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			b.Write(buf[:n])
			b.WriteByte('\n')
		}
		if err != nil {
			if errors.Is(err, syscall.EPIPE) { // records overwritten before we read them: go on
				continue
			}
			break
		}
	}
	return b.String()
}

// nvmeFunction is an NVMe controller's PCI function and the names of its namespace.
type nvmeFunction struct {
	ctrl    string   // nvme1
	aliases []string // /dev/disk/by-id names of its namespace
	last    PCIe
}

// nvmePCIe reads the PCIe health of every NVMe controller's own function (present, config
// space, link, AER counters), as for GPUs and VFs. A slot names its disk, not the disk's PCI
// function, so each reading names the controller (/dev/nvmeX) and its namespace's by-id names,
// and the controller maps it to the slot whose disk is one of them (the OS disk's maps to
// none). A controller gone from sysfs is reported with the names it last had.
func (s *Scanner) nvmePCIe() (out []Finding) {
	aliases := s.nvmeAliases()
	seen := map[string]bool{}
	ctrls, _ := s.FS.ReadDir("/sys/class/nvme")
	for _, c := range ctrls {
		addr := s.FS.LinkBase("/sys/class/nvme/" + c.Name() + "/device")
		if addr == "" {
			continue
		}
		seen[addr] = true
		fn, ok := s.nvmePCI[addr]
		fn.ctrl = c.Name()
		if names := aliases[c.Name()+"n1"]; len(names) > 0 {
			fn.aliases = names
		}
		r := ReadPCIe(s.FS, addr)
		var prev *PCIe
		if ok {
			last := fn.last
			prev = &last
		}
		fn.last = r
		s.nvmePCI[addr] = fn
		s.nvmeNamed(&out, fn, r.Findings(prev, ""))
	}
	for addr, fn := range s.nvmePCI {
		if !seen[addr] && !s.FS.Exists("/sys/bus/pci/devices/"+addr) {
			s.nvmeNamed(&out, fn, (PCIe{Addr: addr}).Findings(nil, ""))
		}
	}
	return out
}

// nvmeNamed adds PCIe findings of an NVMe controller's function, named by its disk.
func (s *Scanner) nvmeNamed(out *[]Finding, fn nvmeFunction, fs []Finding) {
	for _, f := range fs {
		if f.Evidence == nil {
			f.Evidence = map[string]any{}
		}
		f.Evidence["pci_address"] = f.PCIAddress
		f.PCIAddress, f.NVMeDevice, f.NVMeAliases = "", "/dev/"+fn.ctrl, fn.aliases
		f.Detail = "NVMe controller " + fn.ctrl + ": " + f.Detail
		*out = append(*out, f)
	}
}

// nvmeAliases maps each NVMe namespace (nvme1n1) to its /dev/disk/by-id names, sorted.
func (s *Scanner) nvmeAliases() map[string][]string {
	aliases := map[string][]string{}
	links, _ := s.FS.ReadDir("/dev/disk/by-id")
	for _, l := range links {
		name := l.Name()
		if !strings.HasPrefix(name, "nvme-") || strings.Contains(name, "-part") {
			continue
		}
		target := s.FS.LinkBase("/dev/disk/by-id/" + name)
		aliases[target] = append(aliases[target], "/dev/disk/by-id/"+name)
	}
	for _, v := range aliases {
		sort.Strings(v)
	}
	return aliases
}

// nvmeFindings reads each NVMe controller's SMART / Health log (`nvme smart-log /dev/nvmeX -o
// json`) and names its namespace by its /dev/disk/by-id aliases (the controller maps a
// reading to the slot whose disk is one of them; the OS disk's maps to none and is refused).
// The log is read through the admin queue, harmless while a VM uses the namespace as its disk.
func (s *Scanner) nvmeFindings(ctx context.Context) []Finding {
	ctrls, _ := s.FS.ReadDir("/sys/class/nvme")
	if len(ctrls) == 0 {
		return nil
	}
	aliases := s.nvmeAliases()
	var out []Finding
	for _, c := range ctrls {
		ctrl := c.Name()
		b, err := s.Run.Run(ctx, "nvme", "smart-log", "/dev/"+ctrl, "-o", "json")
		if err != nil {
			continue
		}
		log, err := ParseSmartLog(b)
		if err != nil {
			continue
		}
		var prev *SmartLog
		if p, ok := s.smart[ctrl]; ok {
			prev = &p
		}
		s.smart[ctrl] = log
		names := aliases[ctrl+"n1"]
		for _, f := range log.Findings("/dev/"+ctrl, prev) {
			f.NVMeAliases = names
			out = append(out, f)
		}
	}
	return out
}
