package topology

import (
	"fmt"
	"sort"
)

// Approved is the part of an approved slot that discovery can check against the host.
type Approved struct {
	SlotIndex   int
	GPUPCI      string
	NVMeDevice  string // by-id
	FabricVFPCI string
}

// Drift compares approved slots with a fresh report and returns, per slot index, what no
// longer matches the host (changed or missing device, missing VF, newly mounted or written
// disk). Slots without drift are absent from the map.
func Drift(r *Report, slots []Approved) map[int][]string {
	gpus := map[string]GPU{}
	for _, g := range r.GPUs {
		gpus[g.PCIAddress] = g
	}
	nvme := map[string]NVMe{}
	for _, n := range r.NVMe {
		if n.ByID != "" {
			nvme[n.ByID] = n
		}
	}
	vfs := map[string]bool{}
	for _, f := range r.Fabric {
		for _, vf := range f.VFs {
			vfs[vf] = true
		}
	}
	out := map[int][]string{}
	for _, s := range slots {
		var d []string
		if g, ok := gpus[s.GPUPCI]; !ok {
			d = append(d, fmt.Sprintf("GPU %s is no longer on the host", s.GPUPCI))
		} else if g.Driver != "vfio-pci" && g.Driver != "none" {
			d = append(d, fmt.Sprintf("GPU %s is now bound to %s", s.GPUPCI, g.Driver))
		}
		if n, ok := nvme[s.NVMeDevice]; !ok {
			d = append(d, fmt.Sprintf("NVMe %s is no longer on the host", s.NVMeDevice))
		} else {
			if len(n.Mounts) > 0 {
				d = append(d, fmt.Sprintf("NVMe %s is now mounted at %v", s.NVMeDevice, n.Mounts))
			}
			if n.Signature != "" || len(n.Partitions) > 0 {
				d = append(d, fmt.Sprintf("NVMe %s now carries data (%s %v)", s.NVMeDevice, n.Signature, n.Partitions))
			}
			if n.SignatureError != "" {
				d = append(d, fmt.Sprintf("NVMe %s can no longer be probed for signatures: %s", s.NVMeDevice, n.SignatureError))
			}
		}
		if s.FabricVFPCI != "" && !vfs[s.FabricVFPCI] {
			d = append(d, fmt.Sprintf("fabric VF %s is gone", s.FabricVFPCI))
		}
		if len(d) > 0 {
			sort.Strings(d)
			out[s.SlotIndex] = d
		}
	}
	return out
}
