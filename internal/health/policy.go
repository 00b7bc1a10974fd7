// Package health turns device signals into slot health actions: the policy table (Xid codes
// and PCIe, NVMe and nvidia-smi signals to ignore, record, degrade, quarantine or needs reset,
// each row with its source) and the parsers for the formats hosts read (kernel Xid lines,
// `nvidia-smi -q -x`, nvme-cli `smart-log -o json`, PCIe sysfs). The controller stores what
// the actions decide (internal/store, migration 018); docs/health.md is the operator's view.
package health

import (
	"fmt"
	"sort"
)

// Action is what a signal does to the slot it names.
type Action string

const (
	// Ignore: not about the device (an application fault); not stored.
	Ignore Action = "ignore"
	// Record: kept in the slot's history; health unchanged.
	Record Action = "record"
	// Degrade: the slot stays on sale, marked degraded, under watch.
	Degrade Action = "degrade"
	// Quarantine: never placed again until an operator clears it after a passed validation.
	Quarantine Action = "quarantine"
	// NeedsReset: the device needs a reset before it can be trusted. In slice mode the reset
	// happens at VM teardown; the slot is quarantined so it is sold again only after a
	// validation reads the device back (docs/health.md).
	NeedsReset Action = "needs_reset"
)

// StoredAction is the action as the database records it (migration 018): needs reset is a
// quarantine whose clearing validation performs the reset.
func (a Action) StoredAction() string {
	switch a {
	case NeedsReset:
		return "quarantine"
	default:
		return string(a)
	}
}

// Rule is one row of the policy table.
type Rule struct {
	Signal string // "xid:79", "pcie:config_space_unreadable", ...
	Name   string // what the signal means, in NVIDIA's or the spec's words
	Action Action
	Source string // where the meaning and the recommended action come from
}

// xidCatalog is NVIDIA's "Xid Errors" catalog (https://docs.nvidia.com/deploy/xid-errors/),
// the table of Xids and the "Xid Error Listing" with their recommended actions; the GPU
// deployment and management guide's "GPU debug guidelines" for 79, 94, 95, 119 and 120.
const xidCatalog = "NVIDIA Xid Errors catalog, docs.nvidia.com/deploy/xid-errors"

// XidRules maps the Xid codes that say something about the device. An Xid not listed is
// recorded: unknown is not healthy, but it is no reason to stop selling a GPU.
var XidRules = map[int]Rule{
	13:  {Name: "Graphics Engine Exception (usually an application fault)", Action: Record, Source: xidCatalog},
	31:  {Name: "GPU memory page fault (usually an application fault)", Action: Record, Source: xidCatalog},
	43:  {Name: "GPU stopped processing (application fault; the GPU is fine)", Action: Ignore, Source: xidCatalog},
	45:  {Name: "Preemptive cleanup, due to previous errors", Action: Ignore, Source: xidCatalog},
	48:  {Name: "Double Bit ECC Error (uncorrectable; reset the GPU)", Action: Quarantine, Source: xidCatalog},
	61:  {Name: "Internal micro-controller breakpoint/warning", Action: NeedsReset, Source: xidCatalog},
	62:  {Name: "Internal micro-controller halt", Action: NeedsReset, Source: xidCatalog},
	63:  {Name: "ECC page retirement or row remapping recording event", Action: Degrade, Source: xidCatalog},
	64:  {Name: "ECC page retirement or row remapper recording failure", Action: Quarantine, Source: xidCatalog},
	74:  {Name: "NVLink Error", Action: Degrade, Source: xidCatalog},
	79:  {Name: "GPU has fallen off the bus", Action: Quarantine, Source: xidCatalog},
	92:  {Name: "High single-bit ECC error rate", Action: Degrade, Source: xidCatalog},
	94:  {Name: "Contained ECC error (the application is affected; reset the GPU to remap)", Action: NeedsReset, Source: xidCatalog},
	95:  {Name: "Uncontained ECC error (reset the GPU; all applications affected)", Action: Quarantine, Source: xidCatalog},
	119: {Name: "GSP RPC timeout", Action: NeedsReset, Source: xidCatalog},
	120: {Name: "GSP error", Action: NeedsReset, Source: xidCatalog},
	140: {Name: "Unrecovered ECC error", Action: Quarantine, Source: xidCatalog},
}

const (
	pcieSpec  = "PCI Express Base Specification: vendor ID 0xFFFF is no device; Link Status vs Link Capabilities"
	aerDoc    = "Linux Documentation/PCI/pcieaer-howto.rst and sysfs-bus-pci-devices-aer_stats"
	nvmeSpec  = "NVM Express Base Specification, SMART / Health Information log page (02h)"
	smiDoc    = "nvidia-smi(1) -q fields: ECC errors, retired pages, remapped rows, clocks_event_reasons"
	operators = "gpuaas policy: a tenant's report or an operator's decision is reviewed by an operator"
)

// SignalRules are the non-Xid signals.
var SignalRules = map[string]Rule{
	"pcie:absent":                  {Name: "device not present in sysfs", Action: Quarantine, Source: pcieSpec},
	"pcie:config_space_unreadable": {Name: "config space reads 0xffff (device fell off the bus)", Action: Quarantine, Source: pcieSpec},
	"pcie:link_downtrained":        {Name: "current link speed or width below the device's maximum", Action: Degrade, Source: pcieSpec},
	"pcie:aer_correctable_rising":  {Name: "AER correctable errors increased", Action: Record, Source: aerDoc},
	"pcie:aer_nonfatal_rising":     {Name: "AER non-fatal errors increased", Action: Degrade, Source: aerDoc},
	"pcie:aer_fatal_rising":        {Name: "AER fatal errors increased", Action: Quarantine, Source: aerDoc},
	"pcie:driver_unexpected":       {Name: "device bound to another driver than expected", Action: Degrade, Source: "gpuaas slice runtime: slot devices are bound to vfio-pci"},
	"nvme:critical_warning":        {Name: "SMART critical warning set", Action: Quarantine, Source: nvmeSpec},
	"nvme:spare_below_threshold":   {Name: "available spare below its threshold", Action: Quarantine, Source: nvmeSpec},
	"nvme:worn_out":                {Name: "percentage used at or above 100", Action: Degrade, Source: nvmeSpec},
	"nvme:media_errors_rising":     {Name: "media and data integrity errors increased", Action: Degrade, Source: nvmeSpec},
	"gpu:ecc_uncorrectable":        {Name: "volatile uncorrectable (double-bit) ECC errors", Action: Quarantine, Source: smiDoc},
	"gpu:remapped_rows_pending":    {Name: "row remapping pending (needs a GPU reset)", Action: NeedsReset, Source: smiDoc},
	"gpu:remapped_rows_failure":    {Name: "row remapping failed", Action: Quarantine, Source: smiDoc},
	"gpu:retired_pages_pending":    {Name: "page retirement pending (needs a GPU reset)", Action: NeedsReset, Source: smiDoc},
	"gpu:thermal_slowdown":         {Name: "hardware or thermal slowdown active", Action: Record, Source: smiDoc},
	"gpu:nvlink_down":              {Name: "an NVLink link is inactive", Action: Degrade, Source: smiDoc},
	"tenant:reported":              {Name: "the tenant reported a problem when releasing", Action: Quarantine, Source: operators},
	"operator:quarantine":          {Name: "an operator quarantined the slot", Action: Quarantine, Source: operators},
	"validation:failed":            {Name: "a validation run failed", Action: Quarantine, Source: operators},
}

// Decide returns the rule for a signal ("xid:NN" or a SignalRules key). An unknown Xid is
// recorded; an unknown signal is an error (a host speaking a newer vocabulary is visible).
func Decide(signal string) (Rule, error) {
	var code int
	if _, err := fmt.Sscanf(signal, "xid:%d", &code); err == nil && fmt.Sprintf("xid:%d", code) == signal {
		r, ok := XidRules[code]
		if !ok {
			r = Rule{Name: fmt.Sprintf("Xid %d (not in the policy table)", code), Action: Record, Source: xidCatalog}
		}
		r.Signal = signal
		return r, nil
	}
	r, ok := SignalRules[signal]
	if !ok {
		return Rule{}, fmt.Errorf("unknown health signal %q", signal)
	}
	r.Signal = signal
	return r, nil
}

// Table returns every rule, Xids first by code, then the other signals by name (for the docs
// and `gpuaasctl health policy`).
func Table() []Rule {
	var out []Rule
	codes := make([]int, 0, len(XidRules))
	for c := range XidRules {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		r := XidRules[c]
		r.Signal = fmt.Sprintf("xid:%d", c)
		out = append(out, r)
	}
	names := make([]string, 0, len(SignalRules))
	for n := range SignalRules {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r := SignalRules[n]
		r.Signal = n
		out = append(out, r)
	}
	return out
}
