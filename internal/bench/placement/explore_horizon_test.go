package placement

import (
	"math"
	"math/bits"
	"math/rand"

	"github.com/gpuaas/gpuaas/internal/sched"
)

// horizon is an exploration candidate (2026-11-25; see docs/performance.md, "Expected
// departures"): it ranks a placement by the node's expected unusable free GPUs (maskUnusable)
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
	name    string
	p, a    float64
	windows bool
	span    int             // window positions (0: sched.WindowNodes)
	jobs    map[int][]uint8 // node -> the slot mask of each live request
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
		e += math.Pow(h.p, float64(k)) * math.Pow(1-h.p, float64(len(jobs)-k)) * float64(maskUnusable(m))
	}
	return e
}

func (h *horizon) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	order := c.bestFitOrder(size)
	if h.windows {
		span := sched.WindowNodes
		if h.span > 0 {
			span = h.span
		}
		var n int
		var slots []int
		var ok bool
		if c.windows(size, span, order, func(win []int) bool {
			n, slots, ok = h.placeOn(c, size, win)
			if ok && size < slotsPerNode && !singleGroup(slots) { // a span settles nothing: forget it
				h.jobs[n] = h.jobs[n][:len(h.jobs[n])-1]
				return false
			}
			return ok
		}) {
			return n, slots, ok
		}
	}
	return h.placeOn(c, size, order)
}

// placeOn ranks the given nodes and records the chosen request as live on its node.
func (h *horizon) placeOn(c *Cluster, size int, nodes []int) (int, []int, bool) {
	bestNode, bestTake := -1, uint8(0)
	var bestKey [3]float64
	for _, n := range nodes {
		var m uint8
		for s, u := range c.used[n] {
			if !u {
				m |= 1 << s
			}
		}
		if bits.OnesCount8(m) < size {
			continue
		}
		live := h.jobs[n][:0]
		for _, j := range h.jobs[n] {
			if j&m == 0 { // every slot still in use: not left
				live = append(live, j)
			}
		}
		h.jobs[n] = live
		base := h.expected(m, live)
		for _, t := range maskOptions(m, size) {
			after := m &^ t
			now := float64(maskUnusable(after) - maskUnusable(m))
			later := h.expected(after, append(append([]uint8{}, live...), t)) - base
			span := 0.0
			if t&0x0f != 0 && t&0xf0 != 0 && size < slotsPerNode {
				span = 1
			}
			k := [3]float64{span, h.a*now + later, float64(bits.OnesCount8(m))}
			if bestNode < 0 || k[0] < bestKey[0] || k[0] == bestKey[0] && (k[1] < bestKey[1]-1e-9 || math.Abs(k[1]-bestKey[1]) <= 1e-9 && k[2] < bestKey[2]) {
				bestNode, bestTake, bestKey = n, t, k
			}
		}
	}
	if bestNode < 0 {
		return 0, nil, false
	}
	h.jobs[bestNode] = append(h.jobs[bestNode], bestTake)
	var slots []int
	for s := range slotsPerNode {
		if bestTake&(1<<s) != 0 {
			slots = append(slots, s)
		}
	}
	return bestNode, slots, true
}
