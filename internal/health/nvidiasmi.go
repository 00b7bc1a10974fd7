package health

import (
	"encoding/xml"
	"fmt"
	"strconv"
	"strings"
)

// SMIGPU is the part of one <gpu> of `nvidia-smi -q -x` (DTD nvsmi_device_v13) the policy
// reads. Counters read "N/A" where the GPU does not keep them; those stay zero.
type SMIGPU struct {
	ID      string `xml:"id,attr"`
	Product string `xml:"product_name"`
	Serial  string `xml:"serial"`
	UUID    string `xml:"uuid"`
	PCI     struct {
		BusID string `xml:"pci_bus_id"`
		Link  struct {
			MaxGen   string `xml:"pcie_gen>max_link_gen"`
			CurGen   string `xml:"pcie_gen>current_link_gen"`
			MaxWidth string `xml:"link_widths>max_link_width"`
			CurWidth string `xml:"link_widths>current_link_width"`
		} `xml:"pci_gpu_link_info"`
	} `xml:"pci"`
	ECC struct {
		Volatile struct {
			SRAMUncorrectableParity string `xml:"sram_uncorrectable_parity"`
			SRAMUncorrectableSECDED string `xml:"sram_uncorrectable_secded"`
			DRAMUncorrectable       string `xml:"dram_uncorrectable"`
			// Older drivers (DTD v11 and before) have <double_bit><total>.
			DoubleBitTotal string `xml:"double_bit>total"`
		} `xml:"volatile"`
	} `xml:"ecc_errors"`
	RetiredPages struct {
		Pending string `xml:"pending_retirement"`
	} `xml:"retired_pages"`
	RemappedRows struct {
		Pending string `xml:"remapped_row_pending"`
		Failure string `xml:"remapped_row_failure"`
	} `xml:"remapped_rows"`
	Clocks struct {
		HWSlowdown        string `xml:"clocks_event_reason_hw_slowdown"`
		HWThermalSlowdown string `xml:"clocks_event_reason_hw_thermal_slowdown"`
		SWThermalSlowdown string `xml:"clocks_event_reason_sw_thermal_slowdown"`
	} `xml:"clocks_event_reasons"`
}

type smiLog struct {
	XMLName       xml.Name `xml:"nvidia_smi_log"`
	DriverVersion string   `xml:"driver_version"`
	GPUs          []SMIGPU `xml:"gpu"`
}

// ParseNvidiaSMI reads `nvidia-smi -q -x`. Text before the XML declaration (a captured
// command line) is skipped; the DTD reference is not fetched.
func ParseNvidiaSMI(b []byte) ([]SMIGPU, error) {
	s := string(b)
	if i := strings.Index(s, "<?xml"); i > 0 {
		s = s[i:]
	}
	var l smiLog
	dec := xml.NewDecoder(strings.NewReader(s))
	dec.Strict = true
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("nvidia-smi -q -x: %w", err)
	}
	if len(l.GPUs) == 0 {
		return nil, fmt.Errorf("nvidia-smi -q -x: no <gpu> element")
	}
	return l.GPUs, nil
}

// count reads a counter; "N/A" and empty are 0.
func count(s string) uint64 {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func yes(s string) bool { return strings.EqualFold(strings.TrimSpace(s), "Yes") }

func active(s string) bool { return strings.EqualFold(strings.TrimSpace(s), "Active") }

// Findings are the GPU's signals as nvidia-smi reports them.
func (g SMIGPU) Findings() []Finding {
	addr := NormalizePCI(g.PCI.BusID)
	if addr == "" {
		addr = NormalizePCI(g.ID)
	}
	ev := map[string]any{"uuid": g.UUID, "product": g.Product}
	var out []Finding
	add := func(signal, detail string) {
		out = append(out, Finding{PCIAddress: addr, Source: "nvidia-smi", Signal: signal, Detail: detail, Evidence: ev})
	}
	v := g.ECC.Volatile
	if unc := count(v.DRAMUncorrectable) + count(v.SRAMUncorrectableParity) + count(v.SRAMUncorrectableSECDED) + count(v.DoubleBitTotal); unc > 0 {
		add("gpu:ecc_uncorrectable", fmt.Sprintf("%d volatile uncorrectable ECC errors", unc))
	}
	if yes(g.RemappedRows.Failure) {
		add("gpu:remapped_rows_failure", "row remapping failed")
	}
	if yes(g.RemappedRows.Pending) {
		add("gpu:remapped_rows_pending", "row remapping pending")
	}
	if yes(g.RetiredPages.Pending) {
		add("gpu:retired_pages_pending", "page retirement pending")
	}
	if active(g.Clocks.HWSlowdown) || active(g.Clocks.HWThermalSlowdown) || active(g.Clocks.SWThermalSlowdown) {
		add("gpu:thermal_slowdown", "hardware or thermal slowdown active")
	}
	if mw, cw := widthOf(g.PCI.Link.MaxWidth), widthOf(g.PCI.Link.CurWidth); mw > 0 && cw > 0 && cw < mw {
		add("pcie:link_downtrained", fmt.Sprintf("link width x%d of x%d (nvidia-smi)", cw, mw))
	}
	return out
}

// widthOf reads "16x" (nvidia-smi) or "16" (sysfs).
func widthOf(s string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(s), "x"))
	return n
}
