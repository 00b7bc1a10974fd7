package placement

import (
	"math"
	"math/bits"
	"math/rand"

	"github.com/gpuaas/gpuaas/internal/sched"
)

// horizon is an exploration candidate (see docs/placement-quality.md, "Expected departures"): it ranks a placement by the node's expected unusable free GPUs (maskUnusable)
// after a horizon in which each of the node's live requests, this one included, has left with
// probability p, minus the same expectation without this request, plus a times the FGD change
// now. Lifetimes are exponential here, so a request's age says nothing about when it leaves:
// every live request gets the same p. It tells which requests share a node, which the
// controller's ranking does not know (sched.Node has slot counts, not occupants), so it
// infers them: a request is live while all of its slots are in use (requests leave whole),
// checked whenever its node is ranked, so before anything can be placed in its slots again.
//
// One group before a span, then the score, then fewest free slots, then node index; with
// windows it walks production's best-fit windows (Ours) instead of ranking the fleet.
type horizon struct {
	occupants
	name string
	p, a float64
	// wholeHost counts the 8-GPU term this many times in the expectation after the horizon
	// (sched.horizonWholeHost).
	wholeHost float64
}

func (h *horizon) Name() string { return h.name }

// expected is E[maskUnusable] of a node with free slots free once each of jobs has left with
// probability h.p (every subset of them, by its probability).
func (h *horizon) expected(free uint8, jobs []uint8) float64 {
	e := 0.0
	for s := 0; s < 1<<len(jobs); s++ {
		m, k := free, 0
		for j, mask := range jobs {
			if s&(1<<j) != 0 {
				m |= mask
				k++
			}
		}
		e += math.Pow(h.p, float64(k)) * math.Pow(1-h.p, float64(len(jobs)-k)) * maskUnusableWeighted(m, h.wholeHost)
	}
	return e
}

func (h *horizon) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	return h.occupants.place(c, size, func(m uint8, live []uint8) func(t uint8) float64 {
		base := h.expected(m, live)
		return func(t uint8) float64 {
			after := m &^ t
			now := float64(maskUnusable(after) - maskUnusable(m))
			return h.a*now + h.expected(after, append(append([]uint8{}, live...), t)) - base
		}
	})
}

// occupants is what the candidates that know who shares a node have in common: each node's
// live requests (inferred: a request is live while all of its slots are in use, as requests
// leave whole; checked whenever its node is ranked, so before anything can be placed in its
// slots again), and a ranking by a score of each option: one group before a span, then the
// score, then fewest free slots, then node index; over the fleet, or walking production's
// best-fit windows (of span positions; 0: sched.WindowNodes) as Ours does.
type occupants struct {
	windows bool
	span    int
	jobs    map[int][]uint8 // node -> the slot mask of each live request
}

// scorer gives, for a node with free slots m and live requests live, the score of taking t.
type scorer func(m uint8, live []uint8) func(t uint8) float64

func (o *occupants) place(c *Cluster, size int, score scorer) (int, []int, bool) {
	if o.jobs == nil {
		o.jobs = map[int][]uint8{}
	}
	order := c.bestFitOrder(size)
	if o.windows {
		span := sched.WindowNodes
		if o.span > 0 {
			span = o.span
		}
		var n int
		var slots []int
		var ok bool
		if c.windows(size, span, order, func(win []int) bool {
			n, slots, ok = o.placeOn(c, size, win, score)
			if ok && size < slotsPerNode && !singleGroup(slots) { // a span settles nothing: forget it
				o.jobs[n] = o.jobs[n][:len(o.jobs[n])-1]
				return false
			}
			return ok
		}) {
			return n, slots, ok
		}
	}
	return o.placeOn(c, size, order, score)
}

// placeOn ranks the given nodes and records the chosen request as live on its node.
func (o *occupants) placeOn(c *Cluster, size int, nodes []int, score scorer) (int, []int, bool) {
	bestNode, bestTake := -1, uint8(0)
	var bestKey [3]float64
	for _, n := range nodes {
		m := freeMask(c, n)
		if bits.OnesCount8(m) < size {
			continue
		}
		live := o.jobs[n][:0]
		for _, j := range o.jobs[n] {
			if j&m == 0 { // every slot still in use: not left
				live = append(live, j)
			}
		}
		o.jobs[n] = live
		of := score(m, live)
		for _, t := range maskOptions(m, size) {
			span := 0.0
			if t&0x0f != 0 && t&0xf0 != 0 && size < slotsPerNode {
				span = 1
			}
			k := [3]float64{span, of(t), float64(bits.OnesCount8(m))}
			if bestNode < 0 || k[0] < bestKey[0] || k[0] == bestKey[0] && (k[1] < bestKey[1]-1e-9 || math.Abs(k[1]-bestKey[1]) <= 1e-9 && k[2] < bestKey[2]) {
				bestNode, bestTake, bestKey = n, t, k
			}
		}
	}
	if bestNode < 0 {
		return 0, nil, false
	}
	o.jobs[bestNode] = append(o.jobs[bestNode], bestTake)
	return bestNode, maskSlots(bestTake), true
}

// freeMask is node n's free slots as a bit mask.
func freeMask(c *Cluster, n int) uint8 {
	var m uint8
	for s, u := range c.used[n] {
		if !u {
			m |= 1 << s
		}
	}
	return m
}

// maskSlots is the slot indexes of a mask, ascending.
func maskSlots(m uint8) []int {
	var slots []int
	for s := range slotsPerNode {
		if m&(1<<s) != 0 {
			slots = append(slots, s)
		}
	}
	return slots
}
