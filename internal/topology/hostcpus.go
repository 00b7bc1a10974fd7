package topology

import (
	"fmt"
	"slices"
	"sort"

	"github.com/gpuaas/gpuaas/internal/cpuset"
)

// SlotCPUs is one slot as the host CPU assignment sees it: its NUMA node and, when it keeps
// one (an operator's edit, a slot already built), its CPU set.
type SlotCPUs struct {
	SlotIndex int
	NUMANode  *int
	HostCPUs  []int // nil or empty: to be filled
}

// core is one physical core: its SMT siblings, sorted.
type core []int

// nodeCores returns a NUMA node's CPUs and its cores. A report without sibling groups (an
// older discovery, a host whose sysfs lacks them) makes every CPU a core alone.
func nodeCores(n NUMANode) ([]int, []core, error) {
	cpus, err := cpuset.Parse(n.CPUs)
	if err != nil {
		return nil, nil, fmt.Errorf("NUMA node %d: %v", n.Node, err)
	}
	var cores []core
	seen := map[int]bool{}
	for _, l := range n.Cores {
		c, err := cpuset.Parse(l)
		if err != nil {
			return nil, nil, fmt.Errorf("NUMA node %d core %q: %v", n.Node, l, err)
		}
		var kept core
		for _, x := range c {
			if !seen[x] {
				seen[x] = true
				kept = append(kept, x)
			}
		}
		if len(kept) > 0 {
			cores = append(cores, kept)
		}
	}
	for _, x := range cpus {
		if !seen[x] {
			cores = append(cores, core{x})
		}
	}
	in := map[int]bool{}
	for _, x := range cpus {
		in[x] = true
	}
	for _, c := range cores {
		for _, x := range c {
			if !in[x] {
				return nil, nil, fmt.Errorf("NUMA node %d: core %s names CPU %d outside the node's CPUs %s", n.Node, cpuset.Format(c), x, n.CPUs)
			}
		}
	}
	sort.Slice(cores, func(i, j int) bool { return cores[i][0] < cores[j][0] })
	return cpus, cores, nil
}

// DefaultHousekeeping is the housekeeping set kept back for the host when the operator names
// none: the first core (lowest-numbered CPU) of each NUMA node with its SMT siblings.
func DefaultHousekeeping(numa []NUMANode) ([]int, error) {
	var out []int
	for _, n := range numa {
		_, cores, err := nodeCores(n)
		if err != nil {
			return nil, err
		}
		if len(cores) > 0 {
			out = append(out, cores[0]...)
		}
	}
	return cpuset.Union(out), nil
}

// AssignHostCPUs gives every slot with no CPU set one on its NUMA node and returns the sets
// it made, by slot index. A node's cores outside the housekeeping set are its slots' to share:
// each slot to fill gets that share divided by the node's slots (kept and filled alike), or
// fewer when fewer free cores remain, in whole cores, consecutive, in slot-index order, taken
// from the cores that neither housekeeping nor a kept set touches. A core any of whose
// siblings is housekeeping or already owned is never handed out (siblings are never split
// between slots, nor between a slot and the host); cores left over stay with the host. So a
// slot refilled beside kept ones gets the size it had, not the node's spare cores. expected
// is how many slots each NUMA node is meant to hold (its GPUs, from discovery): the share is
// divided by at least that many, so slots approved one at a time get the size they would get
// approved together, and the first never takes the whole node.
// Slots on a node the report does not know, or with no NUMA node, are an error naming the
// slot, as is a node with fewer free cores than slots to fill.
func AssignHostCPUs(numa []NUMANode, housekeeping []int, slots []SlotCPUs, expected map[int]int) (map[int][]int, error) {
	byNode := map[int]NUMANode{}
	for _, n := range numa {
		byNode[n.Node] = n
	}
	taken := map[int]bool{}
	for _, c := range housekeeping {
		taken[c] = true
	}
	fill := map[int][]int{} // NUMA node -> slot indexes to fill
	onNode := map[int]int{} // NUMA node -> its slots, filled or kept
	for _, s := range slots {
		for _, c := range s.HostCPUs {
			taken[c] = true
		}
		if s.NUMANode != nil {
			onNode[*s.NUMANode]++
		}
		if len(s.HostCPUs) > 0 {
			continue
		}
		if s.NUMANode == nil {
			return nil, fmt.Errorf("slot %d has no NUMA node: its host CPUs cannot be chosen (name host_cpus)", s.SlotIndex)
		}
		if _, ok := byNode[*s.NUMANode]; !ok {
			return nil, fmt.Errorf("slot %d is on NUMA node %d, which discovery did not find", s.SlotIndex, *s.NUMANode)
		}
		fill[*s.NUMANode] = append(fill[*s.NUMANode], s.SlotIndex)
	}
	out := map[int][]int{}
	nodes := make([]int, 0, len(fill))
	for n := range fill {
		nodes = append(nodes, n)
	}
	sort.Ints(nodes)
	for _, n := range nodes {
		idx := fill[n]
		sort.Ints(idx)
		_, cores, err := nodeCores(byNode[n])
		if err != nil {
			return nil, err
		}
		var free []core
		share := 0 // cores with no housekeeping CPU: what the node's slots share
		for _, c := range cores {
			ok, hk := true, false
			for _, x := range c {
				ok = ok && !taken[x]
				hk = hk || slices.Contains(housekeeping, x)
			}
			if ok {
				free = append(free, c)
			}
			if !hk {
				share++
			}
		}
		per := min(share/max(onNode[n], expected[n]), len(free)/len(idx))
		if per == 0 {
			return nil, fmt.Errorf("NUMA node %d has %d free cores (after housekeeping and other slots' CPUs) for %d slots %v: give the slots host_cpus or shrink the housekeeping set",
				n, len(free), len(idx), idx)
		}
		for i, slot := range idx {
			var set []int
			for _, c := range free[i*per : (i+1)*per] {
				set = append(set, c...)
			}
			out[slot] = cpuset.Union(set)
		}
	}
	return out, nil
}

// NodeOfCPUs returns, for each CPU of the report, its NUMA node (to check that a slot's CPUs
// lie on its own node).
func NodeOfCPUs(numa []NUMANode) (map[int]int, error) {
	out := map[int]int{}
	for _, n := range numa {
		cpus, err := cpuset.Parse(n.CPUs)
		if err != nil {
			return nil, fmt.Errorf("NUMA node %d: %v", n.Node, err)
		}
		for _, c := range cpus {
			out[c] = n.Node
		}
	}
	return out, nil
}
