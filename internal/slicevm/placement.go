package slicevm

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/cpuset"
	"github.com/gpuaas/gpuaas/internal/domainxml"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/task"
)

// hostNodes reads the host's NUMA nodes and their CPUs (/sys/devices/system/node/nodeN/cpulist).
func hostNodes(fs hostfs.FS) (map[int][]int, error) {
	ents, err := fs.ReadDir("/sys/devices/system/node")
	if err != nil {
		return nil, fmt.Errorf("host NUMA nodes: %w", err)
	}
	nodes := map[int][]int{}
	for _, e := range ents {
		n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "node"))
		if err != nil || !strings.HasPrefix(e.Name(), "node") {
			continue
		}
		b, err := fs.ReadFile("/sys/devices/system/node/" + e.Name() + "/cpulist")
		if err != nil {
			return nil, fmt.Errorf("NUMA node %d CPU list: %w", n, err)
		}
		if nodes[n], err = cpuset.Parse(string(b)); err != nil {
			return nil, fmt.Errorf("NUMA node %d: %w", n, err)
		}
	}
	if len(nodes) == 0 {
		return nil, errors.New("host NUMA nodes: none under /sys/devices/system/node")
	}
	return nodes, nil
}

func minus(a, b []int) []int {
	in := map[int]bool{}
	for _, c := range b {
		in[c] = true
	}
	var out []int
	for _, c := range a {
		if !in[c] {
			out = append(out, c)
		}
	}
	return out
}

// placement is what the host decides for the domain's CPUs and memory, and what it says
// about it (the provision phase detail).
type placement struct {
	bundles []domainxml.Bundle // CPUs, NUMANode, MemoryNode, VCPUs and MemoryMiB filled
	hk      []int
	summary string
}

// place checks the plan's CPU sets against the host and turns them into pins. The libvirt
// runtime refuses a slot without its own CPU set, a set smaller than the slot's vCPUs, CPUs
// off the slot's NUMA node and a plan without housekeeping CPUs: a slice is never silently
// over-subscribed or left to float over other tenants' cores. The lab keeps the guest's NUMA
// cells true to the slots but binds and pins only to what this host has, and says so.
func place(p *task.VMProvision, fs hostfs.FS, lab bool) (placement, error) {
	var pl placement
	own := make([]int, len(p.Bundles))
	for i, b := range p.Bundles {
		own[i] = b.VCPUCount
	}
	total := 0
	for _, v := range own {
		total += v
	}
	if total == 0 {
		total = p.Profile.VCPUCount
	}
	share, err := domainxml.Shares(total, own)
	if err != nil {
		return pl, fmt.Errorf("vCPUs: %v", err)
	}
	nodes, err := hostNodes(fs)
	if err != nil {
		return pl, err
	}
	var all []int
	for _, c := range nodes {
		all = cpuset.Union(all, c)
	}
	if pl.hk, err = cpuset.Parse(p.HousekeepingCPUs); err != nil {
		return pl, fmt.Errorf("housekeeping_cpus: %v", err)
	}
	var notes, unpinned, absentNodes []string
	if lab {
		if gone := minus(pl.hk, all); len(gone) > 0 {
			notes = append(notes, fmt.Sprintf("housekeeping CPUs %s absent here", cpuset.Format(gone)))
			pl.hk = cpuset.Overlap(pl.hk, all)
		}
	} else {
		if len(pl.hk) == 0 {
			return pl, errors.New("the plan names no housekeeping CPUs: the emulator and I/O threads would run on tenant CPUs")
		}
		if gone := minus(pl.hk, all); len(gone) > 0 {
			return pl, fmt.Errorf("housekeeping CPUs %s do not exist on this host (%s)", cpuset.Format(gone), cpuset.Format(all))
		}
	}
	var pinned []int
	for i, b := range p.Bundles {
		db := domainxml.Bundle{NUMANode: b.NUMANode, VCPUs: share[i], MemoryMiB: b.MemoryMiB}
		cpus, err := cpuset.Parse(b.HostCPUs)
		if err != nil {
			return pl, fmt.Errorf("slot %d host_cpus: %v", b.SlotIndex, err)
		}
		if len(cpus) > 0 && len(cpus) < share[i] {
			return pl, fmt.Errorf("slot %d has %d vCPUs but host_cpus %s holds %d CPUs: refusing to over-subscribe", b.SlotIndex, share[i], b.HostCPUs, len(cpus))
		}
		onNode, nodeKnown := all, b.NUMANode == nil
		if b.NUMANode != nil {
			onNode, nodeKnown = nodes[*b.NUMANode]
			if nodeKnown {
				db.MemoryNode = b.NUMANode
			}
		}
		switch {
		case !lab && len(cpus) == 0:
			return pl, fmt.Errorf("slot %d has no host CPU set: its vCPUs would float over every CPU of the host, other tenants' included", b.SlotIndex)
		case !lab && !nodeKnown:
			return pl, fmt.Errorf("slot %d is on NUMA node %d, which this host does not have", b.SlotIndex, *b.NUMANode)
		case !lab && len(minus(cpus, onNode)) > 0:
			where := "on this host"
			if b.NUMANode != nil {
				where = fmt.Sprintf("on its NUMA node %d (%s)", *b.NUMANode, cpuset.Format(onNode))
			}
			return pl, fmt.Errorf("slot %d host CPUs %s are not %s", b.SlotIndex, cpuset.Format(minus(cpus, onNode)), where)
		case !lab:
			db.CPUs = cpus
		default:
			if !nodeKnown {
				absentNodes = append(absentNodes, strconv.Itoa(*b.NUMANode))
			}
			if eff := cpuset.Overlap(cpus, onNode); len(cpus) > 0 && len(eff) >= share[i] {
				db.CPUs = eff
			} else {
				unpinned = append(unpinned, strconv.Itoa(b.SlotIndex))
			}
		}
		pinned = cpuset.Union(pinned, db.CPUs)
		pl.bundles = append(pl.bundles, db)
	}
	if len(absentNodes) > 0 {
		notes = append(notes, "NUMA node "+strings.Join(dedupe(absentNodes), ",")+" absent here: guest cell kept, its memory not bound to it")
	}
	if len(unpinned) > 0 {
		notes = append(notes, "slot "+strings.Join(unpinned, ",")+" vCPUs unpinned: no host CPU set or its CPUs absent here")
	}
	var cells []int
	for _, db := range pl.bundles {
		if db.NUMANode != nil {
			cells = cpuset.Union(cells, []int{*db.NUMANode})
		}
	}
	vcpuPart := "vCPUs not pinned"
	if n := total - unpinnedVCPUs(pl.bundles); n > 0 {
		vcpuPart = fmt.Sprintf("%d vCPUs pinned to slot CPUs %s", n, cpuset.Format(pinned))
	}
	cellPart := "no guest NUMA cells (a slot's NUMA node is unknown)"
	if len(cells) > 0 && len(cells) == countKnown(p.Bundles) {
		cellPart = fmt.Sprintf("%d guest NUMA cell(s) for host node(s) %s", len(cells), cpuset.Format(cells))
	}
	parts := []string{vcpuPart, "emulator and I/O threads on " + orAny(pl.hk), cellPart}
	if lab {
		parts = append(parts, fmt.Sprintf("lab host (%d NUMA node(s), CPUs %s)", len(nodes), cpuset.Format(all)))
		parts = append(parts, notes...)
	}
	pl.summary = strings.Join(parts, "; ")
	return pl, nil
}

func unpinnedVCPUs(bs []domainxml.Bundle) int {
	n := 0
	for _, b := range bs {
		if len(b.CPUs) == 0 {
			n += b.VCPUs
		}
	}
	return n
}

// countKnown is the number of distinct NUMA nodes of the bundles, or -1 when one is unknown
// (domainxml then builds no cells).
func countKnown(bs []task.Bundle) int {
	seen := map[int]bool{}
	for _, b := range bs {
		if b.NUMANode == nil {
			return -1
		}
		seen[*b.NUMANode] = true
	}
	return len(seen)
}

func orAny(s []int) string {
	if len(s) == 0 {
		return "any CPU (unpinned)"
	}
	return cpuset.Format(s)
}

func dedupe(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
