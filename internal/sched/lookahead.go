package sched

import (
	"math"
	"slices"
)

// The look-ahead (docs/performance.md, "Expected departures"). Fragmentation at any moment is
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
	// lookaheadFGD divides the FGD change now in the score (weight 1/2).
	lookaheadFGD = 2
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
// the distribution of the free slots per bucket after the horizon.
type lookahead struct {
	ok      bool
	numa    []int // bucket i's NUMA node; unknownNUMA for the last when the node has such slots
	stride  []int // bucket i's place value in a state's index
	free0   int   // the state now (index)
	dist    []float64
	unus    []int // unusable(state) in mix weight x slots
	eBefore float64
}

// newLookahead builds node nd's look-ahead: free is its free slots per NUMA group (groupsOf).
func newLookahead(mix []mixTerm, nd Node, groups []group) lookahead {
	var la lookahead
	bucket := func(numa int) int {
		if numa < 0 {
			numa = unknownNUMA
		}
		for i, v := range la.numa {
			if v == numa {
				return i
			}
		}
		la.numa = append(la.numa, numa)
		return len(la.numa) - 1
	}
	for _, g := range groups {
		bucket(g.numa)
	}
	for _, o := range nd.Occupants {
		for _, numa := range o.NUMANodes {
			bucket(numa)
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
	free := make([]int, len(la.numa))
	for _, g := range groups {
		free[bucket(g.numa)] += len(g.slots)
	}
	held := make([][]int, len(nd.Occupants))
	capacity := slices.Clone(free)
	for i, o := range nd.Occupants {
		held[i] = make([]int, len(la.numa))
		for _, numa := range o.NUMANodes {
			b := bucket(numa)
			held[i][b]++
			capacity[b]++
		}
	}
	states := 1
	la.stride = make([]int, len(la.numa))
	for b := range la.numa {
		la.stride[b] = states
		states *= capacity[b] + 1
		if states > maxLookaheadStates {
			return lookahead{}
		}
	}
	// The free slots per bucket of each state, and its unusable slots.
	la.unus = make([]int, states)
	for s := range la.unus {
		total, largest := 0, 0
		for b := range la.numa {
			k := s / la.stride[b] % (capacity[b] + 1)
			total += k
			if la.numa[b] == unknownNUMA {
				k = min(k, 1) // each unknown-NUMA slot is a group of its own
			}
			largest = max(largest, k)
		}
		la.unus[s] = unusable(mix, total, largest, nd.ApprovedSlots)
	}
	for b := range la.numa {
		la.free0 += free[b] * la.stride[b]
	}
	// Each allocation leaves independently: the distribution over states, one allocation at a
	// time, in a canonical order so that equal nodes add the same floats in the same order.
	offs := make([]int, len(held))
	for i, h := range held {
		for b, k := range h {
			offs[i] += k * la.stride[b]
		}
	}
	slices.Sort(offs)
	la.dist = make([]float64, states)
	la.dist[la.free0] = 1
	next := make([]float64, states)
	for _, off := range offs {
		clear(next)
		for s, p := range la.dist {
			if p != 0 {
				next[s] += (1 - departureHorizon) * p
				next[s+off] += departureHorizon * p
			}
		}
		la.dist, next = next, la.dist
	}
	la.eBefore = la.expect(0)
	la.ok = true
	return la
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
			numa := sl.NUMANode
			if numa < 0 {
				numa = unknownNUMA
			}
			take += la.stride[slices.Index(la.numa, numa)]
		}
		s += (1 - departureHorizon) * (la.expect(take) - la.eBefore)
	}
	return int64(math.Round(s / scoreUnit))
}
