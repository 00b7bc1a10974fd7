// Package sched ranks slice and baremetal placements. It is pure: candidates in (slots that
// passed every database filter, grouped by node, with each node's NUMA topology), a full
// ranked list of same-node choices out, deterministic for the same input in any order. The
// controller locks the first choice it can and falls back down the list when it loses a race.
//
// Ranking, best first: one NUMA group over spanning groups; nodes already in slice mode over
// clean nodes; the smallest look-ahead (half the fragmentation change now, FGD: how much the
// node's expected unusable free GPUs grow over a demand mix of request sizes, plus how much
// the pick grows them after some of the node's allocations have left: lookahead.go);
// already-fragmented groups over clean ones; best fit in the group, then on the node; fewest
// groups; lowest first slot index; most live allocations on the node; node name; node id.
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
	// PolicyAny takes any healthy slots on one node.
	PolicyAny Policy = "any"
	// PolicyNUMAPreferred takes one NUMA group when the node has one that fits, else spans
	// groups on the node.
	PolicyNUMAPreferred Policy = "numa_preferred"
	// PolicyNUMARequired takes all slots from one NUMA group.
	PolicyNUMARequired Policy = "numa_required"
	// PolicyFullHost takes every approved slot of a node that has exactly N approved slots,
	// all of them free.
	PolicyFullHost Policy = "full_host"
)

// Outcome.Reason values when nothing fits.
const (
	ReasonNoCapacity         = "no_capacity"
	ReasonTopologyFragmented = "topology_fragmented"
	ReasonInvalidRequest     = "invalid_request"
)

const (
	unknownNUMA         = -1
	maxExplainedChoices = 3
)

// The controller does not rank the whole fleet for a reservation: it ranks best-fit windows
// (WindowNodes positions of the placeable nodes with the fewest available slots that could
// hold the request, equally tight ones holding the most live allocations first, ranking at
// most WindowTies nodes alike in both; then the next WindowNodes), and ranks every candidate
// only after WindowsBeforeFullScan windows yield nothing. Windows span 32 positions because
// the look-ahead's choices are often not among the 8 tightest nodes; nodes alike in
// available slots and allocations are mostly alike in what the look-ahead sees (on an empty
// fleet every node is), so reading 8 of them keeps a window's cost there that of 8 nodes.
// Nodes alike that hold no allocation at all differ in nothing the ranking sees but their
// names, so a create alone reads only WindowEmptyTies of those: the rest would cost slot rows
// (a third of an empty fleet's window statement) and could only lose the name tie-break.
// Concurrent creates rank the same windows and each needs a node of its own, so internal/alloc
// gives each create under way in its replica a lane: WindowEmptyTies empty nodes of the window
// that the other lanes pass over (store.WindowRequest.EmptySkip). internal/alloc
// walks the windows; the placement benchmark walks them the same way (one request at a time),
// so the policy it measures is the one in production.
const (
	WindowNodes           = 32
	WindowTies            = 8
	WindowEmptyTies       = 2
	WindowsBeforeFullScan = 4
)

// WindowGroup is the available slots one NUMA group of a node must have for a window holding
// that node to settle req there (Settled): every settled choice but a whole host uses one
// group (a slot of unknown NUMA node being a group of its own), so a window need not read a
// node whose largest group is smaller. A whole host needs none (0).
func WindowGroup(req Request) int {
	p := req.Policy
	if p == "" {
		p = DefaultPolicy(req.GPUs)
	}
	if p == PolicyFullHost {
		return 0
	}
	return req.GPUs
}

// DefaultPolicy is the H200 v1 policy: 1 any, 2 NUMA-preferred, 4 NUMA-required, 8 full host,
// any other count NUMA-preferred.
func DefaultPolicy(gpus int) Policy {
	switch gpus {
	case 1:
		return PolicyAny
	case 2:
		return PolicyNUMAPreferred
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
	NUMANode  int // -1 (any negative) = unknown
}

// Node is a candidate node with its free candidate slots and topology.
type Node struct {
	ID        string
	Name      string
	FreeSlots []Slot // candidate slots on this node that passed every filter
	// Topology of all approved gpu_slice slots of the node (any status), to judge
	// fragmentation.
	GroupSize     map[int]int // NUMA node -> approved slots in that group
	ApprovedSlots int         // approved gpu_slice slots on the node
	ClaimedSlots  int         // slots held by live claims: > 0 means the node is in slice mode
	// Allocations is how many live allocations hold slots on the node. Among choices equal on
	// every criterion but the deterministic tie-breakers, the node with more of them comes
	// first: small allocations packed together free whole groups when they leave together,
	// where spread over equal nodes each departure leaves a hole of its own
	// (docs/placement-quality.md, "Allocations on the node").
	Allocations int
	// Occupants is the live allocations holding slots on the node, for the ranking's
	// look-ahead (lookahead.go): which allocations share a node decides where the holes they
	// leave open. None is a node whose slots no live allocation holds.
	Occupants []Occupant
}

// Request asks for GPUs slots on one node.
type Request struct {
	GPUs   int
	Policy Policy // "" -> DefaultPolicy(GPUs)
	// Mix is the demand the fragmentation score protects: the request sizes expected next
	// and their shares. nil -> DefaultMix().
	Mix []MixEntry
}

// MixEntry is one request size of a demand mix.
type MixEntry struct {
	GPUs   int
	Policy Policy // "" -> DefaultPolicy(GPUs)
	Weight int    // relative share of requests of this size, by count: 1..maxMixWeight
}

const maxMixWeight = 1 << 20 // keeps weight x free slots far from overflow

// DefaultMix is the demand assumed when a request names none: the H200 SKU's counts 1, 2, 4
// and 8 GPUs at 40, 30, 20 and 10% of requests, each under its default policy.
func DefaultMix() []MixEntry {
	return []MixEntry{{GPUs: 1, Weight: 40}, {GPUs: 2, Weight: 30}, {GPUs: 4, Weight: 20}, {GPUs: 8, Weight: 10}}
}

// Choice is one ranked placement.
type Choice struct {
	NodeID          string
	NodeName        string
	SlotIDs         []string // sorted by SlotIndex
	SlotIndexes     []int    // ascending
	NUMANodes       []int    // distinct NUMA groups used, ascending (-1 = unknown)
	SingleNUMA      bool
	FullHost        bool // every approved slot of the node (full_host policy)
	NodeInSliceMode bool
	GroupFragmented bool // a chosen group already had claimed/unavailable slots before this pick
	GroupRemainder  int  // free slots left in the chosen group(s) after the pick
	NodeRemainder   int  // free slots left on the node after the pick
	// FragmentationDelta is how much the pick grows the node's expected unusable free GPUs:
	// the sum over the demand mix of share x free slots on the node when that size could no
	// longer be placed there, after minus before (FGD, Weng et al., ATC '23). Lower is better;
	// negative when the pick uses up GPUs that some sizes could not use anyway.
	FragmentationDelta float64
	// Lookahead is the ranking's fragmentation criterion, in the same unit: a third of the FGD
	// change now plus how much the pick grows the node's expected unusable free GPUs after a
	// horizon in which each live allocation on the node, this one included, has left with
	// probability 1/5, the whole-host terms counted twice there (lookahead.go). Lower is better.
	Lookahead float64
	Reason    string
	// Tier numbers the choices' ranking classes, best first: choices with the same Tier are
	// equally good by the policy and differ only in the deterministic tie-breakers (slot
	// index, live allocations on the node, node name, id). Concurrent schedulers spread over a tier (SpreadTies) instead of
	// all racing for its first choice.
	Tier int
}

// Outcome is the ranked result, or a diagnosis when nothing fits.
type Outcome struct {
	Choices []Choice // best first; empty when nothing fits
	// Diagnosis when Choices is empty.
	Reason       string // "", "no_capacity", "topology_fragmented" or "invalid_request"
	FreeSlots    int    // candidate free slots over all nodes
	MaxNodeFree  int    // most free candidate slots on one node
	MaxGroupFree int    // most free candidate slots in one NUMA group (an unknown-NUMA slot is a group of one)
	Message      string
}

// group is the free slots of one NUMA group of a node; every unknown-NUMA slot is a group
// of its own.
type group struct {
	numa  int    // -1 = unknown
	size  int    // approved slots in the group, at least len(slots)
	slots []Slot // free, by slot index
}

// fragmented reports whether something in the group is already used or unavailable. An
// unknown-NUMA singleton is never fragmented: there is no group to judge.
func (g group) fragmented() bool { return g.numa >= 0 && g.size > len(g.slots) }

// groupsOf splits a node's free slots into NUMA groups ordered by NUMA id, unknown-NUMA
// singletons last by slot index; each group's slots are ordered by slot index (then id).
// It reuses the scratch buffers slotBuf and groupBuf (the result aliases them) and returns
// them grown for the next call; the caller's FreeSlots are not modified.
func groupsOf(n Node, slotBuf []Slot, groupBuf []group) ([]group, []Slot) {
	ss := append(slotBuf[:0], n.FreeSlots...)
	for i := range ss {
		if ss[i].NUMANode < 0 {
			ss[i].NUMANode = unknownNUMA
		}
	}
	sort.Sort(byNUMAThenIndex(ss))
	out := groupBuf[:0]
	for i := 0; i < len(ss); {
		j := i + 1
		if ss[i].NUMANode >= 0 {
			for j < len(ss) && ss[j].NUMANode == ss[i].NUMANode {
				j++
			}
		}
		g := group{numa: ss[i].NUMANode, slots: ss[i:j:j], size: j - i}
		if g.numa >= 0 && n.GroupSize[g.numa] > g.size {
			g.size = n.GroupSize[g.numa]
		}
		out = append(out, g)
		i = j
	}
	return out, ss
}

// byNUMAThenIndex orders slots by NUMA node (unknown last), slot index, id.
type byNUMAThenIndex []Slot

func (s byNUMAThenIndex) Len() int      { return len(s) }
func (s byNUMAThenIndex) Swap(i, j int) { s[i], s[j] = s[j], s[i] }
func (s byNUMAThenIndex) Less(i, j int) bool {
	a, b := s[i], s[j]
	if (a.NUMANode < 0) != (b.NUMANode < 0) {
		return b.NUMANode < 0
	}
	if a.NUMANode != b.NUMANode {
		return a.NUMANode < b.NUMANode
	}
	return byIndex(s).Less(i, j)
}

// byIndex orders slots by slot index, then id.
type byIndex []Slot

func (s byIndex) Len() int      { return len(s) }
func (s byIndex) Swap(i, j int) { s[i], s[j] = s[j], s[i] }
func (s byIndex) Less(i, j int) bool {
	if s[i].SlotIndex != s[j].SlotIndex {
		return s[i].SlotIndex < s[j].SlotIndex
	}
	return s[i].ID < s[j].ID
}

// ranked is a choice with the ranking keys that Choice does not carry.
type ranked struct {
	Choice
	groups int   // NUMA groups used; each unknown-NUMA slot counts as its own group
	kind   kind  // what the choice is, for its reason
	gpus   int   // slots requested, for its reason
	frag   int   // FragmentationDelta in mix weight x slots
	score  int64 // the ranking's fragmentation criterion (lookahead.score)
	total  int   // the mix's total weight, to print frag as a share
	allocs int   // Node.Allocations
}

type kind int

const (
	kindSingle kind = iota
	kindSpan
	kindFullHost
)

func validPolicy(p Policy) bool {
	switch p {
	case PolicyAny, PolicyNUMAPreferred, PolicyNUMARequired, PolicyFullHost:
		return true
	}
	return false
}

// PlaceSlice ranks every viable same-node placement for req, best first. It never panics on
// bad input: GPUs <= 0 or an unknown policy give Reason "invalid_request".
func PlaceSlice(req Request, nodes []Node) Outcome {
	var out Outcome
	policy := req.Policy
	if policy == "" {
		policy = DefaultPolicy(req.GPUs)
	}
	if req.GPUs <= 0 {
		out.Reason = ReasonInvalidRequest
		out.Message = fmt.Sprintf("gpus must be positive, got %d", req.GPUs)
		return out
	}
	if !validPolicy(policy) {
		out.Reason = ReasonInvalidRequest
		out.Message = fmt.Sprintf("unknown topology policy %q (want any, numa_preferred, numa_required or full_host)", policy)
		return out
	}
	mix, total, msg := resolveMix(req.Mix)
	if msg != "" {
		out.Reason = ReasonInvalidRequest
		out.Message = msg
		return out
	}
	n := req.GPUs
	// Capacity hint: a node yields one candidate per NUMA group that fits (at most free/n),
	// or one span or full host.
	hint := 0
	for _, nd := range nodes {
		if free := len(nd.FreeSlots); free >= n {
			hint += min(max(free/n, 1), len(nd.GroupSize)+1)
		}
	}
	cands := make([]ranked, 0, hint)
	var slotBuf []Slot
	var groupBuf, spanBuf []group
	var la lookahead // scratch space, reused from node to node
	nodesWithFree := 0
	for _, nd := range nodes {
		free := len(nd.FreeSlots)
		if free == 0 {
			continue
		}
		nodesWithFree++
		out.FreeSlots += free
		out.MaxNodeFree = max(out.MaxNodeFree, free)
		var groups []group
		groups, slotBuf = groupsOf(nd, slotBuf, groupBuf)
		groupBuf = groups
		for _, g := range groups {
			out.MaxGroupFree = max(out.MaxGroupFree, len(g.slots))
		}
		if free < n {
			continue
		}
		// The fragmentation change needs the largest group free after the pick: the largest
		// other group, or what the pick leaves in its own.
		top, second := -1, 0
		for i, g := range groups {
			if top < 0 || len(g.slots) > len(groups[top].slots) {
				if top >= 0 {
					second = len(groups[top].slots)
				}
				top = i
			} else {
				second = max(second, len(g.slots))
			}
		}
		before := unusable(mix, free, len(groups[top].slots), nd.ApprovedSlots)
		la.reset(mix, nd, groups)
		if policy == PolicyFullHost {
			if free == n && nd.ApprovedSlots == n {
				all := make([]Slot, 0, free)
				for _, g := range groups {
					all = append(all, g.slots...)
				}
				cands = append(cands, makeChoice(nd, all, groups, kindFullHost, n, -before, total, la.score(all, -before)))
			}
			continue
		}
		single := false
		for i, g := range groups {
			if len(g.slots) < n {
				continue // unknown-NUMA singletons fit only n == 1
			}
			single = true
			largest := len(groups[top].slots)
			if i == top {
				largest = max(len(g.slots)-n, second)
			}
			after := unusable(mix, free-n, largest, nd.ApprovedSlots)
			cands = append(cands, makeChoice(nd, g.slots[:n], []group{g}, kindSingle, n, after-before, total, la.score(g.slots[:n], after-before)))
		}
		if single || policy == PolicyNUMARequired {
			continue
		}
		// Span the fewest groups: most free first, then NUMA id (unknown-NUMA singletons
		// after known groups of one), lowest slot indexes within each group.
		gs := append(spanBuf[:0], groups...)
		spanBuf = gs
		sort.SliceStable(gs, func(i, j int) bool { return len(gs[i].slots) > len(gs[j].slots) })
		pick := make([]Slot, 0, n)
		used, largest := 0, 0
		for _, g := range gs {
			if len(pick) == n {
				largest = max(largest, len(g.slots)) // the first untouched group is the largest
				break
			}
			take := min(n-len(pick), len(g.slots))
			pick = append(pick, g.slots[:take]...)
			largest = len(g.slots) - take // every earlier group is used up
			used++
		}
		after := unusable(mix, free-n, largest, nd.ApprovedSlots)
		cands = append(cands, makeChoice(nd, pick, gs[:used], kindSpan, n, after-before, total, la.score(pick, after-before)))
	}
	if len(cands) > 0 {
		order := make([]int, len(cands))
		for i := range order {
			order[i] = i
		}
		sort.Slice(order, func(i, j int) bool { return less(&cands[order[i]], &cands[order[j]]) })
		out.Choices = make([]Choice, len(cands))
		for i, k := range order {
			out.Choices[i] = cands[k].Choice
			out.Choices[i].Reason = reason(&cands[k])
			if i > 0 {
				out.Choices[i].Tier = out.Choices[i-1].Tier
				if !tied(&cands[order[i-1]], &cands[k]) {
					out.Choices[i].Tier++
				}
			}
		}
		return out
	}
	across := plural(nodesWithFree, "node", "nodes")
	if out.FreeSlots < n {
		out.Reason = ReasonNoCapacity
		if out.FreeSlots == 0 {
			out.Message = fmt.Sprintf("no slots are free; %d requested", n)
		} else {
			out.Message = fmt.Sprintf("only %s free across %s; %d requested",
				plural(out.FreeSlots, "slot is", "slots are"), across, n)
		}
		return out
	}
	out.Reason = ReasonTopologyFragmented
	lead := fmt.Sprintf("%s free across %s, but", plural(out.FreeSlots, "slot is", "slots are"), across)
	switch policy {
	case PolicyNUMARequired:
		out.Message = fmt.Sprintf("%s no node offers %d slots in one NUMA group (largest: %d)", lead, n, out.MaxGroupFree)
	case PolicyFullHost:
		out.Message = fmt.Sprintf("%s no node has exactly %d approved slots all free (most free on one node: %d)", lead, n, out.MaxNodeFree)
	default:
		out.Message = fmt.Sprintf("%s no node offers %d free slots (largest: %d)", lead, n, out.MaxNodeFree)
	}
	return out
}

// Settled reports whether a ranking of part of the fleet (a best-fit window) can be taken as it
// is: its best choice uses one NUMA group, or a whole node. When the best a window offers spans
// groups, a node outside the window may still offer one group, so the controller reads on and
// takes a span only from the whole fleet's ranking (NUMA-local whenever feasible).
func (o Outcome) Settled() bool {
	return len(o.Choices) > 0 && (o.Choices[0].SingleNUMA || o.Choices[0].FullHost)
}

// plural formats "1 slot is" / "3 slots are".
func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// mixTerm is one resolved entry of the demand mix.
type mixTerm struct {
	gpus   int
	policy Policy
	weight int
	// horizonCap bounds a whole-host term's weight at the look-ahead's horizon
	// (unusableWeighted): the weight of the mix's NUMA-group terms, or its own if larger.
	horizonCap int
}

// resolveMix checks a request's demand mix (nil: DefaultMix) and returns it with its total
// weight, or a message saying what is wrong with it.
func resolveMix(in []MixEntry) ([]mixTerm, int, string) {
	if in == nil {
		in = DefaultMix()
	}
	if len(in) == 0 {
		return nil, 0, "demand mix is empty (leave it unset for the default)"
	}
	out := make([]mixTerm, len(in))
	total := 0
	for i, e := range in {
		p := e.Policy
		if p == "" {
			p = DefaultPolicy(e.GPUs)
		}
		switch {
		case e.GPUs <= 0:
			return nil, 0, fmt.Sprintf("demand mix entry %d: gpus must be positive, got %d", i, e.GPUs)
		case e.Weight <= 0 || e.Weight > maxMixWeight:
			return nil, 0, fmt.Sprintf("demand mix entry %d: weight must be 1 to %d, got %d", i, maxMixWeight, e.Weight)
		case !validPolicy(p):
			return nil, 0, fmt.Sprintf("demand mix entry %d: unknown topology policy %q", i, p)
		}
		out[i] = mixTerm{gpus: e.GPUs, policy: p, weight: e.Weight}
		total += e.Weight
		if total > maxMixWeight {
			return nil, 0, fmt.Sprintf("demand mix weights add up to more than %d", maxMixWeight)
		}
	}
	// A whole host counts horizonWholeHost times at the horizon, but never more than the
	// NUMA-group (numa_required) requests it competes with for the same free slots: where
	// whole hosts are already most of the demand, doubling them had the look-ahead give up
	// 4-GPU requests for 8-GPU ones (docs/placement-quality.md, "Placement under other demand").
	group := 0
	for _, m := range out {
		if m.policy == PolicyNUMARequired {
			group += m.weight
		}
	}
	for i := range out {
		out[i].horizonCap = max(out[i].weight, group)
	}
	return out, total, ""
}

// unusable is a node's expected unusable free slots over the mix, in weight x slots: each
// size that the node could not place contributes its weight times the node's free slots.
// largest is the most free slots in one NUMA group (an unknown-NUMA slot is a group of one).
func unusable(mix []mixTerm, free, largest, approved int) int {
	return unusableWeighted(mix, free, largest, approved, 1)
}

// unusableWeighted is unusable with the whole-host terms of the mix weighed wholeHost times,
// each at most its horizonCap.
func unusableWeighted(mix []mixTerm, free, largest, approved, wholeHost int) int {
	u := 0
	for _, m := range mix {
		var fits bool
		switch m.policy {
		case PolicyNUMARequired:
			fits = largest >= m.gpus
		case PolicyFullHost:
			fits = free == m.gpus && approved == m.gpus
		default:
			fits = free >= m.gpus
		}
		if !fits {
			w := m.weight
			if m.policy == PolicyFullHost && wholeHost > 1 {
				w = min(w*wholeHost, m.horizonCap)
			}
			u += w * free
		}
	}
	return u
}

func makeChoice(nd Node, pick []Slot, used []group, k kind, n, frag, total int, score int64) ranked {
	ps := pick // copied before sorting: pick may alias the caller's scratch buffer
	if !sort.IsSorted(byIndex(ps)) {
		ps = append([]Slot(nil), pick...)
		sort.Sort(byIndex(ps))
	}
	c := Choice{
		NodeID:          nd.ID,
		NodeName:        nd.Name,
		SlotIDs:         make([]string, len(ps)),
		SlotIndexes:     make([]int, len(ps)),
		SingleNUMA:      len(used) == 1,
		FullHost:        k == kindFullHost,
		NodeInSliceMode: nd.ClaimedSlots > 0,
		NodeRemainder:   len(nd.FreeSlots) - len(ps),
	}
	for i, s := range ps {
		c.SlotIDs[i] = s.ID
		c.SlotIndexes[i] = s.SlotIndex
	}
	groupFree := 0
	c.NUMANodes = make([]int, 0, len(used))
	for _, g := range used {
		groupFree += len(g.slots)
		c.GroupFragmented = c.GroupFragmented || g.fragmented()
		if i := sort.SearchInts(c.NUMANodes, g.numa); i == len(c.NUMANodes) || c.NUMANodes[i] != g.numa {
			c.NUMANodes = append(c.NUMANodes, 0)
			copy(c.NUMANodes[i+1:], c.NUMANodes[i:])
			c.NUMANodes[i] = g.numa
		}
	}
	c.GroupRemainder = groupFree - len(ps)
	c.FragmentationDelta = float64(frag) / float64(total)
	c.Lookahead = float64(score) * scoreUnit / float64(total)
	return ranked{Choice: c, groups: len(used), kind: k, gpus: n, frag: frag, score: score, total: total, allocs: nd.Allocations}
}

// reason is one sentence naming what the choice is and the ranking facts behind its place,
// e.g. "single NUMA group 0 on node n1 (node in slice mode, fragmented group, group
// remainder 2, node remainder 5)".
func reason(r *ranked) string {
	var b strings.Builder
	b.Grow(160)
	mode := "clean node"
	if r.NodeInSliceMode {
		mode = "node in slice mode"
	}
	switch r.kind {
	case kindFullHost:
		b.WriteString("full host ")
		b.WriteString(r.NodeName)
		b.WriteString(": all ")
		b.WriteString(itoa(r.gpus))
		b.WriteString(" approved slots free (")
		b.WriteString(mode)
		b.WriteString(", fragmentation change ")
		b.WriteString(signed2(r.frag, r.total))
		b.WriteString(", look-ahead ")
		b.WriteString(signed2(int(r.score), r.total*int(1/scoreUnit)))
		b.WriteString(")")
		return b.String()
	case kindSingle:
		frag := "clean group"
		if r.GroupFragmented {
			frag = "fragmented group"
		}
		if r.NUMANodes[0] < 0 {
			b.WriteString("single slot of unknown NUMA")
			frag = "group unknown"
		} else {
			b.WriteString("single NUMA group ")
			b.WriteString(itoa(r.NUMANodes[0]))
		}
		b.WriteString(" on node ")
		b.WriteString(r.NodeName)
		b.WriteString(" (")
		b.WriteString(mode)
		b.WriteString(", ")
		b.WriteString(frag)
	default:
		frag := "clean groups"
		if r.GroupFragmented {
			frag = "fragmented groups"
		}
		b.WriteString("spans ")
		b.WriteString(itoa(r.groups))
		b.WriteString(" NUMA groups (")
		known := 0
		for _, numa := range r.NUMANodes {
			if numa < 0 {
				continue
			}
			if known > 0 {
				b.WriteString(", ")
			}
			b.WriteString(itoa(numa))
			known++
		}
		for i := known; i < r.groups; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("unknown")
		}
		b.WriteString(") on node ")
		b.WriteString(r.NodeName)
		b.WriteString(", no single group has ")
		b.WriteString(itoa(r.gpus))
		b.WriteString(" free (")
		b.WriteString(mode)
		b.WriteString(", ")
		b.WriteString(frag)
	}
	b.WriteString(", fragmentation change ")
	b.WriteString(signed2(r.frag, r.total))
	b.WriteString(", look-ahead ")
	b.WriteString(signed2(int(r.score), r.total*int(1/scoreUnit)))
	b.WriteString(", group remainder ")
	b.WriteString(itoa(r.GroupRemainder))
	b.WriteString(", node remainder ")
	b.WriteString(itoa(r.NodeRemainder))
	b.WriteString(")")
	return b.String()
}

// signed2 formats num/den with a sign and two decimals, rounded half away from zero, e.g.
// "+0.70", "-0.30", "+0.00".
func signed2(num, den int) string {
	sign := "+"
	if num < 0 {
		sign, num = "-", -num
	}
	if den <= 0 {
		return sign + "0.00"
	}
	h := (200*num + den) / (2 * den) // hundredths, rounded
	if h == 0 {
		sign = "+"
	}
	frac := itoa(h % 100)
	if len(frac) == 1 {
		frac = "0" + frac
	}
	return sign + itoa(h/100) + "." + frac
}

// itoa formats an int without fmt (reasons are built for every candidate).
func itoa(v int) string {
	if v >= 0 && v < 10 {
		return string(rune('0' + v))
	}
	var buf [20]byte
	i := len(buf)
	u := uint64(v)
	if v < 0 {
		u = uint64(-v)
	}
	for u >= 10 {
		i--
		buf[i] = byte('0' + u%10)
		u /= 10
	}
	i--
	buf[i] = byte('0' + u)
	if v < 0 {
		i--
		buf[i] = '-'
	}
	return string(buf[i:])
}

// tied reports whether a and b are equal on every criterion of less before the
// deterministic tie-breakers.
func tied(a, b *ranked) bool {
	return a.SingleNUMA == b.SingleNUMA && a.NodeInSliceMode == b.NodeInSliceMode && a.score == b.score &&
		a.GroupFragmented == b.GroupFragmented && a.GroupRemainder == b.GroupRemainder &&
		a.NodeRemainder == b.NodeRemainder && a.groups == b.groups
}

// SpreadTies returns the choices in the order a scheduler should try them: the best choice
// first, then tier by tier, each tier shuffled by intn (e.g. math/rand/v2.IntN). With
// best-fit ranking concurrent requests see the same ranking; tried in the same order they
// convoy, one winning per round and the rest losing a lock race on each choice in turn (16
// concurrent clients made four lock attempts per create). The first choice stays first: a
// request that meets no competition takes exactly what the ranking says (its name
// tie-break packs equal nodes in order, which the placement simulation shows keeps
// fragmentation lower than picking among them at random); only the requests that lost it
// scatter over the rest of its tier. The input is not modified.
func SpreadTies(choices []Choice, intn func(int) int) []Choice {
	out := append([]Choice(nil), choices...)
	for lo := 1; lo < len(out); {
		hi := lo + 1
		for hi < len(out) && out[hi].Tier == out[lo].Tier {
			hi++
		}
		run := out[lo:hi]
		for i := len(run) - 1; i > 0; i-- {
			j := intn(i + 1)
			run[i], run[j] = run[j], run[i]
		}
		lo = hi
	}
	return out
}

// less is the ranking: single NUMA, slice-mode node, smallest look-ahead,
// fragmented group, best fit in group, best fit on node, fewest groups, first slot index,
// most live allocations on the node, node name, node id; slot ids last so the order is total.
func less(a, b *ranked) bool {
	if a.SingleNUMA != b.SingleNUMA {
		return a.SingleNUMA
	}
	if a.NodeInSliceMode != b.NodeInSliceMode {
		return a.NodeInSliceMode
	}
	if a.score != b.score {
		return a.score < b.score
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
	if a.groups != b.groups {
		return a.groups < b.groups
	}
	if a.SlotIndexes[0] != b.SlotIndexes[0] {
		return a.SlotIndexes[0] < b.SlotIndexes[0]
	}
	if a.allocs != b.allocs {
		return a.allocs > b.allocs
	}
	if a.NodeName != b.NodeName {
		return a.NodeName < b.NodeName
	}
	if a.NodeID != b.NodeID {
		return a.NodeID < b.NodeID
	}
	for i := range min(len(a.SlotIDs), len(b.SlotIDs)) {
		if a.SlotIDs[i] != b.SlotIDs[i] {
			return a.SlotIDs[i] < b.SlotIDs[i]
		}
	}
	return len(a.SlotIDs) < len(b.SlotIDs)
}

// BaremetalNode is a whole node eligible for a baremetal allocation.
type BaremetalNode struct {
	ID, Name      string
	ApprovedSlots int
}

// RankBaremetal orders eligible whole nodes: nodes with no approved slice slots first (keep
// slice-capable nodes for slices), then by name, then id. The input is not modified.
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
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].ApprovedSlots < out[j].ApprovedSlots
	})
	return out
}

// Explain summarizes an outcome in a few lines for people: the top three choices, or the
// diagnosis when nothing fits.
func Explain(o Outcome) string {
	var b strings.Builder
	if len(o.Choices) == 0 {
		r := o.Reason
		if r == "" {
			r = ReasonNoCapacity
		}
		fmt.Fprintf(&b, "no placement: %s\n", r)
		if o.Message != "" {
			fmt.Fprintf(&b, "%s\n", o.Message)
		}
		if r != ReasonInvalidRequest {
			fmt.Fprintf(&b, "free slots: %d, most on one node: %d, most in one NUMA group: %d",
				o.FreeSlots, o.MaxNodeFree, o.MaxGroupFree)
		}
		return strings.TrimRight(b.String(), "\n")
	}
	fmt.Fprintf(&b, "%s, best first:\n", plural(len(o.Choices), "ranked choice", "ranked choices"))
	for i, c := range o.Choices {
		if i == maxExplainedChoices {
			fmt.Fprintf(&b, "... and %d more\n", len(o.Choices)-maxExplainedChoices)
			break
		}
		fmt.Fprintf(&b, "%d. slots %v: %s\n", i+1, c.SlotIndexes, c.Reason)
	}
	return strings.TrimRight(b.String(), "\n")
}
