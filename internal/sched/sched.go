// Package sched ranks slice and baremetal placements. It is pure: candidates in (slots that
// passed every database filter, grouped by node, with each node's NUMA topology), a full
// ranked list of same-node choices out, deterministic for the same input in any order. The
// controller locks the first choice it can and falls back down the list when it loses a race.
package sched

import (
	"fmt"
	"sort"
	"strings"
)

// Policy is a topology policy for one GPU count (seed 001 "SKU and Pricing Direction").
type Policy string

// Policies.
const (
	PolicyAny           Policy = "any"
	PolicyNUMAPreferred Policy = "numa_preferred"
	PolicyNUMARequired  Policy = "numa_required"
	PolicyFullHost      Policy = "full_host"
)

// DefaultPolicy is the H200 v1 policy: 1 any, 2 NUMA-preferred, 4 NUMA-required, 8 full host.
func DefaultPolicy(gpus int) Policy {
	switch gpus {
	case 1:
		return PolicyAny
	case 4:
		return PolicyNUMARequired
	case 8:
		return PolicyFullHost
	default:
		return PolicyNUMAPreferred
	}
}

// Slot is a candidate slot.
type Slot struct {
	ID        string
	SlotIndex int
	NUMANode  int // -1 = unknown
}

// Node is a candidate node with its free candidate slots and topology.
type Node struct {
	ID            string
	Name          string
	FreeSlots     []Slot
	GroupSize     map[int]int // NUMA node -> approved slots (any status)
	ApprovedSlots int
	ClaimedSlots  int // live slot claims: > 0 means the node is in slice mode
}

// Request asks for GPUs slots on one node.
type Request struct {
	GPUs   int
	Policy Policy
}

// Choice is one ranked placement.
type Choice struct {
	NodeID          string
	NodeName        string
	SlotIDs         []string
	SlotIndexes     []int
	NUMANodes       []int
	SingleNUMA      bool
	NodeInSliceMode bool
	GroupFragmented bool
	GroupRemainder  int
	NodeRemainder   int
	Reason          string
}

// Outcome is the ranked result, or a diagnosis when nothing fits.
type Outcome struct {
	Choices      []Choice
	Reason       string // "", "no_capacity", "topology_fragmented" or "invalid_request"
	FreeSlots    int
	MaxNodeFree  int
	MaxGroupFree int
	Message      string
}

type group struct {
	numa  int
	size  int // approved slots in the group
	slots []Slot
}

// groupsOf splits a node's free slots into NUMA groups; unknown NUMA slots are singletons.
func groupsOf(n Node) []group {
	by := map[int][]Slot{}
	var unknown []group
	for _, s := range n.FreeSlots {
		if s.NUMANode < 0 {
			unknown = append(unknown, group{numa: -1, size: 1, slots: []Slot{s}})
			continue
		}
		by[s.NUMANode] = append(by[s.NUMANode], s)
	}
	var out []group
	for numa, ss := range by {
		sort.Slice(ss, func(i, j int) bool { return ss[i].SlotIndex < ss[j].SlotIndex })
		size := n.GroupSize[numa]
		if size < len(ss) {
			size = len(ss)
		}
		out = append(out, group{numa: numa, size: size, slots: ss})
	}
	sort.Slice(unknown, func(i, j int) bool { return unknown[i].slots[0].SlotIndex < unknown[j].slots[0].SlotIndex })
	sort.Slice(out, func(i, j int) bool { return out[i].numa < out[j].numa })
	return append(out, unknown...)
}

func (g group) fragmented() bool { return g.numa >= 0 && g.size > len(g.slots) }

// PlaceSlice ranks every viable same-node placement for req.
func PlaceSlice(req Request, nodes []Node) Outcome {
	var out Outcome
	if req.GPUs <= 0 {
		out.Reason, out.Message = "invalid_request", "gpus must be positive"
		return out
	}
	policy := req.Policy
	if policy == "" {
		policy = DefaultPolicy(req.GPUs)
	}
	for _, n := range nodes {
		free := len(n.FreeSlots)
		out.FreeSlots += free
		if free > out.MaxNodeFree {
			out.MaxNodeFree = free
		}
		groups := groupsOf(n)
		for _, g := range groups {
			if g.numa >= 0 && len(g.slots) > out.MaxGroupFree {
				out.MaxGroupFree = len(g.slots)
			}
		}
		if out.MaxGroupFree == 0 && free > 0 {
			out.MaxGroupFree = 1
		}
		if free < req.GPUs {
			continue
		}
		inSlice := n.ClaimedSlots > 0
		if policy == PolicyFullHost {
			if free == req.GPUs && n.ApprovedSlots == req.GPUs {
				out.Choices = append(out.Choices, makeChoice(n, n.FreeSlots, groups, inSlice, false, 0, 0, "full host"))
			}
			continue
		}
		single := false
		for _, g := range groups {
			if len(g.slots) < req.GPUs || (g.numa < 0 && req.GPUs > 1) {
				continue
			}
			single = true
			pick := g.slots[:req.GPUs]
			c := makeChoice(n, pick, []group{g}, inSlice, g.fragmented(), len(g.slots)-req.GPUs, free-req.GPUs, "")
			c.SingleNUMA = true
			out.Choices = append(out.Choices, c)
		}
		if !single && policy != PolicyNUMARequired {
			// Span the fewest groups: largest groups first, then NUMA id.
			gs := append([]group(nil), groups...)
			sort.SliceStable(gs, func(i, j int) bool { return len(gs[i].slots) > len(gs[j].slots) })
			var pick []Slot
			var used []group
			frag := false
			rem := 0
			for _, g := range gs {
				if len(pick) == req.GPUs {
					break
				}
				take := min(req.GPUs-len(pick), len(g.slots))
				pick = append(pick, g.slots[:take]...)
				used = append(used, g)
				frag = frag || g.fragmented()
				rem += len(g.slots) - take
			}
			out.Choices = append(out.Choices, makeChoice(n, pick, used, inSlice, frag, rem, free-req.GPUs, ""))
		}
	}
	sort.SliceStable(out.Choices, func(i, j int) bool { return less(out.Choices[i], out.Choices[j]) })
	if len(out.Choices) == 0 {
		if out.FreeSlots >= req.GPUs {
			out.Reason = "topology_fragmented"
			out.Message = fmt.Sprintf("%d slots are free across %d nodes, but no node offers %d slots satisfying %s (most on one node: %d, in one NUMA group: %d)",
				out.FreeSlots, countNodes(nodes), req.GPUs, policy, out.MaxNodeFree, out.MaxGroupFree)
		} else {
			out.Reason = "no_capacity"
			out.Message = fmt.Sprintf("%d slots are free in all; %d requested", out.FreeSlots, req.GPUs)
		}
	}
	return out
}

func countNodes(nodes []Node) int {
	n := 0
	for _, nd := range nodes {
		if len(nd.FreeSlots) > 0 {
			n++
		}
	}
	return n
}

func makeChoice(n Node, pick []Slot, used []group, inSlice, frag bool, groupRem, nodeRem int, why string) Choice {
	ps := append([]Slot(nil), pick...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].SlotIndex < ps[j].SlotIndex })
	c := Choice{NodeID: n.ID, NodeName: n.Name, NodeInSliceMode: inSlice, GroupFragmented: frag,
		GroupRemainder: groupRem, NodeRemainder: nodeRem}
	numas := map[int]bool{}
	for _, s := range ps {
		c.SlotIDs = append(c.SlotIDs, s.ID)
		c.SlotIndexes = append(c.SlotIndexes, s.SlotIndex)
		numas[s.NUMANode] = true
	}
	for k := range numas {
		c.NUMANodes = append(c.NUMANodes, k)
	}
	sort.Ints(c.NUMANodes)
	c.SingleNUMA = len(used) == 1
	var parts []string
	if why != "" {
		parts = append(parts, why)
	}
	if c.SingleNUMA {
		parts = append(parts, fmt.Sprintf("single NUMA group %d", c.NUMANodes[0]))
	} else {
		parts = append(parts, fmt.Sprintf("spans NUMA groups %v", c.NUMANodes))
	}
	if inSlice {
		parts = append(parts, "node already in slice mode")
	} else {
		parts = append(parts, "clean node")
	}
	if frag {
		parts = append(parts, "fragmented group")
	}
	parts = append(parts, fmt.Sprintf("group remainder %d, node remainder %d", groupRem, nodeRem))
	c.Reason = fmt.Sprintf("node %s slots %v: %s", n.Name, c.SlotIndexes, strings.Join(parts, ", "))
	return c
}

// less is the ranking: single NUMA, slice-mode node, fragmented group, best fit in group,
// best fit on node, fewest groups, first slot index, node name, node id.
func less(a, b Choice) bool {
	if a.SingleNUMA != b.SingleNUMA {
		return a.SingleNUMA
	}
	if a.NodeInSliceMode != b.NodeInSliceMode {
		return a.NodeInSliceMode
	}
	if a.GroupFragmented != b.GroupFragmented {
		return a.GroupFragmented
	}
	if a.GroupRemainder != b.GroupRemainder {
		return a.GroupRemainder < b.GroupRemainder
	}
	if a.NodeRemainder != b.NodeRemainder {
		return a.NodeRemainder < b.NodeRemainder
	}
	if len(a.NUMANodes) != len(b.NUMANodes) {
		return len(a.NUMANodes) < len(b.NUMANodes)
	}
	if a.SlotIndexes[0] != b.SlotIndexes[0] {
		return a.SlotIndexes[0] < b.SlotIndexes[0]
	}
	if a.NodeName != b.NodeName {
		return a.NodeName < b.NodeName
	}
	return a.NodeID < b.NodeID
}

// BaremetalNode is a whole node eligible for a baremetal allocation.
type BaremetalNode struct {
	ID, Name      string
	ApprovedSlots int
}

// RankBaremetal puts nodes without approved slice slots first (slice-capable nodes are kept
// for slices), then orders by name and id.
func RankBaremetal(nodes []BaremetalNode) []BaremetalNode {
	out := append([]BaremetalNode(nil), nodes...)
	sort.SliceStable(out, func(i, j int) bool {
		ai, bi := out[i].ApprovedSlots > 0, out[j].ApprovedSlots > 0
		if ai != bi {
			return !ai
		}
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Explain summarizes an outcome in a few lines for people.
func Explain(o Outcome) string {
	if len(o.Choices) == 0 {
		return fmt.Sprintf("%s: %s", o.Reason, o.Message)
	}
	var b strings.Builder
	for i, c := range o.Choices {
		if i == 3 {
			fmt.Fprintf(&b, "... %d more choices", len(o.Choices)-3)
			break
		}
		fmt.Fprintf(&b, "%d. %s\n", i+1, c.Reason)
	}
	return strings.TrimRight(b.String(), "\n")
}
