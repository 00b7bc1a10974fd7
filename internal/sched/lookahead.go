package sched

import (
	"math"
	"slices"
)

// The look-ahead (docs/placement-quality.md, "Expected departures"). Fragmentation at any moment is
// mostly holes that departures have just opened in otherwise full nodes; which allocation leaves
// next is not the scheduler's to choose, but which allocations share a node is. The ranking's
// fragmentation criterion is therefore not only the FGD change now but how much the pick grows
// the node's expected unusable free GPUs after a horizon in which each live allocation on the
// node, the new one included, has left with probability departureHorizon (lifetimes are not
// known, so every allocation gets the same chance): score = the FGD change / lookaheadFGD + the
// expected change. A small allocation then goes where the holes it will leave join others'
// (two single holes are worse than one double hole), and a node that is about to empty is not
// pinned by a newcomer.

const (
	// departureHorizon is each live allocation's chance of having left by the horizon.
	departureHorizon = 0.2
	// lookaheadFGD divides the FGD change now in the score (weight 1/3, chosen over 1/2:
	// docs/placement-quality.md, "The FGD change at a third").
	lookaheadFGD = 3
	// horizonWholeHost weighs the whole-host terms of the mix (8 GPUs on a GPU server) this
	// many times in the expectation after the horizon, not in the FGD change now
	// (docs/placement-quality.md, "A whole host counts double at the horizon"). A node is empty again
	// only when every allocation on it has left, and only an empty node serves a whole-host
	// request; at weight 1 the look-ahead traded empty nodes for free NUMA groups, and the
	// free GPUs of nodes that were not empty were most of the unusable ones.
	horizonWholeHost = 2
	// maxLookaheadStates bounds the node states the expectation walks: the product over a
	// node's NUMA groups of (slots that are free or held by live allocations + 1), 25 for two
	// groups of four. A node past it (a topology far from any GPU server's) is scored as if
	// none of its allocations left: the FGD change x (1/lookaheadFGD + 1 - departureHorizon).
	maxLookaheadStates = 4096
	// scoreUnit is the fixed point of the score (mix weight x slots / scoreUnit): the
	// expectation is a float sum whose last bits depend on the order of the node's groups, and
	// rounding it keeps mirror-image nodes tied.
	scoreUnit = 1e-6
)

// Occupant is one live allocation's slots on a node: the NUMA node of each (negative:
// unknown).
type Occupant struct {
	NUMANodes []int
}

// lookahead is one node's expectation: its slots that are free or held by live allocations, in
// buckets (one per NUMA node, in id order, then one for the slots of unknown NUMA node), and
// the distribution of the free slots per bucket after the horizon. Its slices are scratch space
// that PlaceSlice reuses from node to node.
type lookahead struct {
	ok       bool
	numa     []int // bucket i's NUMA node; unknownNUMA for the last when the node has such slots
	stride   []int // bucket i's place value in a state's index
	free     []int // free slots per bucket now
	capacity []int // free or held slots per bucket
	offs     []int // each allocation's slots as a state offset
	dist     []float64
	next     []float64
	unus     []int // unusable(state) in mix weight x slots
	eBefore  float64
}

// reset makes la node nd's look-ahead, reusing la's scratch space: groups is nd's free slots per
// NUMA group (groupsOf).
func (la *lookahead) reset(mix []mixTerm, nd Node, groups []group) {
	la.ok = false
	la.numa = la.numa[:0]
	for _, g := range groups {
		la.addBucket(g.numa)
	}
	for _, o := range nd.Occupants {
		for _, numa := range o.NUMANodes {
			la.addBucket(numa)
		}
	}
	// Known NUMA nodes in id order, unknown last: the state's layout does not depend on the
	// order slots and occupants came in.
	slices.SortFunc(la.numa, func(a, b int) int {
		switch {
		case a == b:
			return 0
		case a == unknownNUMA:
			return 1
		case b == unknownNUMA:
			return -1
		}
		return a - b
	})
	k := len(la.numa)
	la.free, la.capacity, la.stride = zeroed(la.free, k), zeroed(la.capacity, k), zeroed(la.stride, k)
	for _, g := range groups {
		b := la.bucket(g.numa)
		la.free[b] += len(g.slots)
		la.capacity[b] += len(g.slots)
	}
	for _, o := range nd.Occupants {
		for _, numa := range o.NUMANodes {
			la.capacity[la.bucket(numa)]++
		}
	}
	states := 1
	for b := range la.numa {
		la.stride[b] = states
		states *= la.capacity[b] + 1
		if states > maxLookaheadStates {
			return
		}
	}
	// The unusable slots of each state (free slots per bucket).
	la.unus = zeroed(la.unus, states)
	for s := range la.unus {
		total, largest := 0, 0
		for b := range la.numa {
			n := s / la.stride[b] % (la.capacity[b] + 1)
			total += n
			if la.numa[b] == unknownNUMA {
				n = min(n, 1) // each unknown-NUMA slot is a group of its own
			}
			largest = max(largest, n)
		}
		la.unus[s] = unusableWeighted(mix, total, largest, nd.ApprovedSlots, horizonWholeHost)
	}
	now := 0
	for b := range la.numa {
		now += la.free[b] * la.stride[b]
	}
	// Each allocation leaves independently: the distribution over states, one allocation at a
	// time, in a canonical order so that equal nodes add the same floats in the same order.
	la.offs = la.offs[:0]
	for _, o := range nd.Occupants {
		off := 0
		for _, numa := range o.NUMANodes {
			off += la.stride[la.bucket(numa)]
		}
		la.offs = append(la.offs, off)
	}
	slices.Sort(la.offs)
	la.dist, la.next = zeroed(la.dist, states), zeroed(la.next, states)
	la.dist[now] = 1
	for _, off := range la.offs {
		clear(la.next)
		for s, p := range la.dist {
			if p != 0 {
				la.next[s] += (1 - departureHorizon) * p
				la.next[s+off] += departureHorizon * p
			}
		}
		la.dist, la.next = la.next, la.dist
	}
	la.eBefore = la.expect(0)
	la.ok = true
}

// addBucket adds NUMA node numa's bucket if it has none.
func (la *lookahead) addBucket(numa int) {
	if numa < 0 {
		numa = unknownNUMA
	}
	if !slices.Contains(la.numa, numa) {
		la.numa = append(la.numa, numa)
	}
}

// bucket is NUMA node numa's bucket.
func (la *lookahead) bucket(numa int) int {
	if numa < 0 {
		numa = unknownNUMA
	}
	return slices.Index(la.numa, numa)
}

// zeroed is buf resized to n zeros, reusing its array when it is large enough.
func zeroed[T int | float64](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n)
	}
	buf = buf[:n]
	clear(buf)
	return buf
}

// expect is the expected unusable slots after the horizon when the slots at offset take (a
// state index) are taken now and stay taken.
func (la *lookahead) expect(take int) float64 {
	e := 0.0
	for s, p := range la.dist {
		if p != 0 {
			e += p * float64(la.unus[s-take])
		}
	}
	return e
}

// score is the ranking's fragmentation criterion for taking pick, in scoreUnit: frag (the FGD
// change now) / lookaheadFGD, plus the expected change after the horizon. The new allocation
// leaves by then with departureHorizon's chance, which restores the state without it: so the
// change is (1 - departureHorizon) x (E[after taking pick] - E[now]).
func (la *lookahead) score(pick []Slot, frag int) int64 {
	s := float64(frag) / lookaheadFGD
	if !la.ok {
		s += (1 - departureHorizon) * float64(frag)
	} else {
		take := 0
		for _, sl := range pick {
			take += la.stride[la.bucket(sl.NUMANode)]
		}
		s += (1 - departureHorizon) * (la.expect(take) - la.eBefore)
	}
	return int64(math.Round(s / scoreUnit))
}
