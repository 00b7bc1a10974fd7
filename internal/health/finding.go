package health

import "strings"

// Finding is one signal a reader saw on one device, before the policy applies: the device's
// PCI address (or NVMe device), the policy table's signal key, and what was read.
type Finding struct {
	PCIAddress string `json:"pci_address,omitempty"`
	// A guest's reading names its GPU by position in its allocation (GPUIndex), not by a
	// host PCI address it cannot know.
	AllocationID string `json:"allocation_id,omitempty"`
	GPUIndex     *int   `json:"gpu_index,omitempty"`
	NVMeDevice   string `json:"nvme_device,omitempty"`
	// NVMeAliases are the /dev/disk/by-id names of an NVMe finding's namespace (slots name
	// their disk by one of them).
	NVMeAliases []string       `json:"nvme_aliases,omitempty"`
	Source      string         `json:"source"`
	Signal      string         `json:"signal"`
	Detail      string         `json:"detail,omitempty"`
	Evidence    map[string]any `json:"evidence,omitempty"`
}

// NormalizePCI writes a PCI address the way sysfs and slot maps do (0000:1b:00.0): nvidia-smi
// prints an 8-digit domain in capitals (00000000:1B:00.0), the kernel's Xid lines drop the
// function (0000:1b:00). An address without a function gets ".0".
func NormalizePCI(a string) string {
	a = strings.ToLower(strings.TrimSpace(a))
	if parts := strings.SplitN(a, ":", 2); len(parts) == 2 && len(parts[0]) == 8 && strings.HasPrefix(parts[0], "0000") {
		a = parts[0][4:] + ":" + parts[1]
	}
	if strings.Count(a, ":") == 2 && !strings.Contains(a, ".") {
		a += ".0"
	}
	return a
}
