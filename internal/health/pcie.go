package health

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// PCIe is one reading of a PCI function's health from sysfs (/sys/bus/pci/devices/ADDR),
// through the host root.
type PCIe struct {
	Addr    string
	Present bool
	// VendorID is the first word of config space; 0xffff is no device answering (a function
	// that fell off the bus reads all ones).
	VendorID       uint16
	ConfigReadable bool
	CurSpeed       float64 // GT/s; 0 unknown
	MaxSpeed       float64
	CurWidth       int
	MaxWidth       int
	// AER counters (TOTAL_ERR_*) of aer_dev_correctable, aer_dev_nonfatal, aer_dev_fatal; nil
	// where the kernel exposes no AER for the function.
	AERCorrectable *uint64
	AERNonFatal    *uint64
	AERFatal       *uint64
	Driver         string // the bound driver's name, "" none
}

// ReadPCIe reads a function's sysfs attributes.
func ReadPCIe(fs hostfs.FS, addr string) PCIe {
	dir := "/sys/bus/pci/devices/" + addr
	r := PCIe{Addr: addr, Present: fs.Exists(dir)}
	if !r.Present {
		return r
	}
	if head, err := fs.ReadHead(dir+"/config", 2); err == nil && len(head) == 2 {
		r.VendorID, r.ConfigReadable = binary.LittleEndian.Uint16(head), true
	} else if b, err := fs.ReadFile(dir + "/vendor"); err == nil {
		if v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 16); err == nil {
			r.VendorID, r.ConfigReadable = uint16(v), true
		}
	}
	r.CurSpeed, r.MaxSpeed = speedOf(fs, dir+"/current_link_speed"), speedOf(fs, dir+"/max_link_speed")
	r.CurWidth, r.MaxWidth = intOf(fs, dir+"/current_link_width"), intOf(fs, dir+"/max_link_width")
	r.AERCorrectable = aerTotal(fs, dir+"/aer_dev_correctable")
	r.AERNonFatal = aerTotal(fs, dir+"/aer_dev_nonfatal")
	r.AERFatal = aerTotal(fs, dir+"/aer_dev_fatal")
	r.Driver = fs.LinkBase(dir + "/driver")
	return r
}

// speedOf reads "32.0 GT/s PCIe" (or "16 GT/s", "Unknown"): GT/s, 0 when unknown.
func speedOf(fs hostfs.FS, p string) float64 {
	b, err := fs.ReadFile(p)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return v
}

func intOf(fs hostfs.FS, p string) int {
	b, err := fs.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// aerTotal reads an aer_dev_* file ("RxErr 0\n...\nTOTAL_ERR_COR 3\n"): its TOTAL_ERR_ line,
// or the sum of its counters where a kernel prints none.
func aerTotal(fs hostfs.FS, p string) *uint64 {
	b, err := fs.ReadFile(p)
	if err != nil {
		return nil
	}
	var sum uint64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		if strings.HasPrefix(f[0], "TOTAL_ERR_") {
			return &n
		}
		sum += n
	}
	return &sum
}

// PCIeFindings compares a reading with the previous one of the same function (nil: the first,
// whose counters count from zero) and with the driver the slot runtime expects ("" any). The
// link speed is compared only for a function not bound to the nvidia driver, which lowers
// the speed of an idle GPU's link on purpose; the width is always compared.
func (r PCIe) Findings(prev *PCIe, wantDriver string) []Finding {
	ev := map[string]any{"vendor_id": fmt.Sprintf("0x%04x", r.VendorID), "current_link_speed": r.CurSpeed,
		"max_link_speed": r.MaxSpeed, "current_link_width": r.CurWidth, "max_link_width": r.MaxWidth, "driver": r.Driver}
	var out []Finding
	add := func(signal, detail string) {
		out = append(out, Finding{PCIAddress: r.Addr, Source: "pcie", Signal: signal, Detail: detail, Evidence: ev})
	}
	if !r.Present {
		add("pcie:absent", "no such PCI function in sysfs")
		return out
	}
	if !r.ConfigReadable || r.VendorID == 0xffff {
		add("pcie:config_space_unreadable", "config space reads 0xffff")
		return out
	}
	if r.MaxWidth > 0 && r.CurWidth > 0 && r.CurWidth < r.MaxWidth {
		add("pcie:link_downtrained", fmt.Sprintf("link width x%d of x%d", r.CurWidth, r.MaxWidth))
	} else if r.Driver != "nvidia" && r.MaxSpeed > 0 && r.CurSpeed > 0 && r.CurSpeed < r.MaxSpeed {
		add("pcie:link_downtrained", fmt.Sprintf("link speed %g GT/s of %g GT/s", r.CurSpeed, r.MaxSpeed))
	}
	rising := func(cur, before *uint64, signal, what string) {
		if cur == nil {
			return
		}
		var was uint64
		if prev != nil && before != nil {
			was = *before
		}
		if *cur > was {
			ev["aer_"+what] = *cur
			add(signal, fmt.Sprintf("AER %s errors %d -> %d", what, was, *cur))
		}
	}
	var pc, pn, pf *uint64
	if prev != nil {
		pc, pn, pf = prev.AERCorrectable, prev.AERNonFatal, prev.AERFatal
	}
	rising(r.AERFatal, pf, "pcie:aer_fatal_rising", "fatal")
	rising(r.AERNonFatal, pn, "pcie:aer_nonfatal_rising", "non-fatal")
	rising(r.AERCorrectable, pc, "pcie:aer_correctable_rising", "correctable")
	if wantDriver != "" && r.Driver != wantDriver {
		add("pcie:driver_unexpected", fmt.Sprintf("bound to %q, expected %q", r.Driver, wantDriver))
	}
	return out
}
