package health

import (
	"regexp"
	"strconv"
	"strings"
)

// xidRE matches the NVIDIA driver's Xid report in the kernel log, as NVIDIA's Xid catalog
// documents it:
//
//	NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
//
// with or without a dmesg timestamp or a journal prefix before "NVRM:", and in the older form
// without "PCI:" (NVRM: Xid (0000:3b:00): 13, ...).
var xidRE = regexp.MustCompile(`NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (\d{1,4}),\s*(.*)$`)

// Xid is one parsed Xid line.
type Xid struct {
	PCIAddress string // normalized, with function 0 (the GPU's function)
	Code       int
	Text       string // the rest of the line: pid, process name, the driver's words
}

// ParseXid reads one kernel log line; ok is false for any line that is not an Xid report.
func ParseXid(line string) (Xid, bool) {
	m := xidRE.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
	if m == nil {
		return Xid{}, false
	}
	code, err := strconv.Atoi(m[2])
	if err != nil {
		return Xid{}, false
	}
	return Xid{PCIAddress: NormalizePCI(m[1]), Code: code, Text: strings.TrimSpace(m[3])}, true
}

// XidFindings are the findings of the Xid lines in a kernel log excerpt, in order.
func XidFindings(log string) []Finding {
	var out []Finding
	for _, line := range strings.Split(log, "\n") {
		x, ok := ParseXid(line)
		if !ok {
			continue
		}
		out = append(out, Finding{PCIAddress: x.PCIAddress, Source: "kernel", Signal: "xid:" + strconv.Itoa(x.Code),
			Detail: "Xid " + strconv.Itoa(x.Code) + ": " + x.Text, Evidence: map[string]any{"line": strings.TrimSpace(line)}})
	}
	return out
}
