package topology

import (
	"fmt"
	"slices"
	"strings"
)

// candidates pairs each GPU (in PCI order) with the first free NUMA-local NVMe and the first
// free fabric VF on the same NUMA node, then records every reason the bundle cannot be
// approved. Nothing is fixed up: a bundle that would need a workaround is blocked.
func candidates(r *Report, opt Options) []Candidate {
	usedNVMe := map[string]bool{}
	usedVF := map[string]bool{}
	out := []Candidate{}
	for i, g := range r.GPUs {
		c := Candidate{SlotIndex: i, ApprovalRequired: true, GPUPCI: g.PCIAddress, GPUModel: g.Model, NUMANode: g.NUMANode,
			BlockingReasons: []string{}}
		block := func(format string, args ...any) {
			c.BlockingReasons = append(c.BlockingReasons, fmt.Sprintf(format, args...))
		}
		if g.NUMANode == nil {
			block("GPU NUMA node unknown (numa_node -1): locality cannot be proven")
		}
		switch {
		case g.Driver == "vfio-pci", g.Driver == "none", opt.VFIORebind:
		default:
			block("GPU bound to %s; slice passthrough needs vfio-pci (bind persistently, e.g. driverctl)", g.Driver)
		}
		if g.IOMMUGroup == nil {
			block("GPU has no IOMMU group: IOMMU is off (intel_iommu=on / amd_iommu=on, iommu=pt)")
		} else if unrelated := unrelatedPeers(g); len(unrelated) > 0 {
			block("IOMMU group %d is shared with unrelated devices %s", *g.IOMMUGroup, strings.Join(unrelated, ", "))
		}
		// NVMe: NUMA-local, never the OS disk, never without a stable identity.
		var nv *NVMe
		for k := range r.NVMe {
			n := &r.NVMe[k]
			if usedNVMe[n.Namespace] || n.OSDisk || n.ByID == "" || !sameNUMA(n.NUMANode, g.NUMANode) {
				continue
			}
			nv = n
			break
		}
		switch {
		case nv == nil && len(r.NVMe) == 0:
			block("no NVMe device found on this host")
		case nv == nil:
			block("no free NUMA-local NVMe with a stable /dev/disk/by-id identity (the OS disk is never offered)")
		default:
			usedNVMe[nv.Namespace] = true
			c.NVMeDevice, c.NVMeNamespace = nv.ByID, nv.Namespace
			if len(nv.Mounts) > 0 {
				block("NVMe %s is mounted at %s: run the storage transition first", nv.Namespace, strings.Join(nv.Mounts, ", "))
			}
			if len(nv.Partitions) > 0 {
				block("NVMe %s has partitions %s (a host share?): run the storage transition first", nv.Namespace, strings.Join(nv.Partitions, ", "))
			}
			if nv.Signature != "" {
				block("NVMe %s carries a %s signature: it must be transitioned (wiped) before slice use", nv.Namespace, nv.Signature)
			}
			if nv.SignatureError != "" {
				block("NVMe %s could not be probed for signatures, so what it holds is unknown: %s", nv.Namespace, nv.SignatureError)
			}
		}
		// Fabric: an SR-IOV VF of its own, on the same NUMA node. A parent alone is not enough.
		var parentOnly string
		for k := range r.Fabric {
			f := &r.Fabric[k]
			if !sameNUMA(f.NUMANode, g.NUMANode) {
				continue
			}
			for _, vf := range f.VFs {
				if !usedVF[vf] {
					usedVF[vf] = true
					c.FabricParentPCI, c.FabricVFPCI, c.Fabric = f.PCIAddress, vf, f.Fabric
					break
				}
			}
			if c.FabricVFPCI != "" {
				break
			}
			if parentOnly == "" {
				parentOnly = f.PCIAddress
			}
		}
		switch {
		case c.FabricVFPCI != "":
		case parentOnly != "":
			block("only the parent fabric device %s is present (no free SR-IOV VF): a shared parent is not concurrency proof", parentOnly)
		default:
			block("no NUMA-local fabric (InfiniBand/RoCE) device")
		}
		c.Ready = len(c.BlockingReasons) == 0
		out = append(out, c)
	}
	return out
}

func sameNUMA(a, b *int) bool { return a != nil && b != nil && *a == *b }

// unrelatedPeers are IOMMU group members other than the GPU's own functions (same
// domain:bus:device, e.g. its audio function) and PCIe bridges reported by the group.
func unrelatedPeers(g GPU) []string {
	slot := g.PCIAddress[:strings.LastIndex(g.PCIAddress, ".")]
	var out []string
	for _, p := range g.IOMMUPeers {
		if !strings.HasPrefix(p, slot+".") {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}
