package sched

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

// bruteLookahead is the look-ahead score by its definition, independent of lookahead.go: every
// subset of the node's allocations (the new one included) leaving, by its probability, with the
// unusable slots computed from the free slots per NUMA node.
func bruteLookahead(nd Node, pick []Slot) float64 {
	mix, total, _ := resolveMix(nil)
	free := map[int]int{}
	for _, s := range nd.FreeSlots {
		free[s.NUMANode]++
	}
	// u is the unusable slots with the whole-host terms counted wholeHost times.
	u := func(f map[int]int, wholeHost int) float64 {
		sum, largest := 0, 0
		for numa, k := range f {
			sum += k
			if numa < 0 {
				k = min(k, 1)
			}
			largest = max(largest, k)
		}
		extra := 0
		for _, m := range mix {
			if m.policy == PolicyFullHost && (sum != m.gpus || nd.ApprovedSlots != m.gpus) {
				extra += (wholeHost - 1) * m.weight * sum
			}
		}
		return float64(unusable(mix, sum, largest, nd.ApprovedSlots) + extra)
	}
	expect := func(start map[int]int, occ [][]int) float64 {
		e := 0.0
		for set := 0; set < 1<<len(occ); set++ {
			f := map[int]int{}
			for k, v := range start {
				f[k] = v
			}
			p := 1.0
			for i, o := range occ {
				if set&(1<<i) == 0 {
					p *= 1 - departureHorizon
					continue
				}
				p *= departureHorizon
				for _, numa := range o {
					f[numa]++
				}
			}
			e += p * u(f, horizonWholeHost)
		}
		return e
	}
	var occ [][]int
	for _, o := range nd.Occupants {
		occ = append(occ, o.NUMANodes)
	}
	after := map[int]int{}
	for k, v := range free {
		after[k] = v
	}
	var mine []int
	for _, s := range pick {
		after[s.NUMANode]--
		mine = append(mine, s.NUMANode)
	}
	now := u(after, 1) - u(free, 1)
	return (now/lookaheadFGD + expect(after, append(occ, mine)) - expect(free, occ)) / float64(total)
}

// occupied is a node of two NUMA groups of four (slots 0-3, 4-7) whose allocations hold the
// given slots; the rest are free.
func occupied(name string, allocs ...[]int) Node {
	held := map[int]bool{}
	var occ []Occupant
	for _, a := range allocs {
		o := Occupant{}
		for _, s := range a {
			held[s] = true
			o.NUMANodes = append(o.NUMANodes, s/4)
		}
		occ = append(occ, o)
	}
	var free []int
	for s := 0; s < 8; s++ {
		if !held[s] {
			free = append(free, s)
		}
	}
	n := node(name, len(held), free...)
	n.Allocations, n.Occupants = len(allocs), occ
	return n
}

func TestLookaheadMatchesItsDefinition(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for iter := 0; iter < 300; iter++ {
		// Random allocations of 1, 2 and 4 slots packed into the groups, some slots left free.
		var allocs [][]int
		next := []int{0, 4}
		for g := 0; g < 2; g++ {
			for next[g] < 4*(g+1) && r.Intn(5) > 0 {
				size := min([]int{1, 1, 2, 4}[r.Intn(4)], 4*(g+1)-next[g])
				var a []int
				for range size {
					a = append(a, next[g])
					next[g]++
				}
				allocs = append(allocs, a)
			}
		}
		nd := occupied(fmt.Sprintf("n%d", iter), allocs...)
		if r.Intn(4) == 0 && len(nd.FreeSlots) > 0 { // a slot of unknown NUMA node
			nd.FreeSlots[0].NUMANode = -1
		}
		for _, gpus := range []int{1, 2, 4, 8} {
			for _, c := range PlaceSlice(Request{GPUs: gpus}, []Node{nd}).Choices {
				var pick []Slot
				for _, id := range c.SlotIDs {
					for _, s := range nd.FreeSlots {
						if s.ID == id {
							pick = append(pick, s)
						}
					}
				}
				if want := bruteLookahead(nd, pick); math.Abs(c.Lookahead-want) > 1e-5 {
					t.Fatalf("%v, %d GPUs, %s: look-ahead %v, by definition %v", allocs, gpus, short(c), c.Lookahead, want)
				}
			}
		}
	}
}

// Two nodes alike in everything the ranking looked at before the look-ahead (free slots and
// where, the FGD change, live allocations) but not in who holds their slots: the last free slot
// goes where the allocations that will free slots next to it are, not by name.
func TestLookaheadPlacesByWhoSharesTheNode(t *testing.T) {
	// b: group 0 one 4-GPU allocation, group 1 a 2- and a 1-GPU one: taking its last slot
	// scores -0.57 (bruteLookahead), against a's -0.51.
	b := occupied("b", []int{0, 1, 2, 3}, []int{4, 5}, []int{6})
	// a: group 0 two 2-GPU allocations, group 1 one 3-slot one.
	a := occupied("a", []int{0, 1}, []int{2, 3}, []int{4, 5, 6})
	for _, order := range [][]Node{{a, b}, {b, a}} {
		o := PlaceSlice(Request{GPUs: 1}, order)
		if len(o.Choices) != 2 {
			t.Fatalf("want a choice on each node, got %v", shorts(o))
		}
		first, second := o.Choices[0], o.Choices[1]
		if first.FragmentationDelta != second.FragmentationDelta || first.NodeRemainder != second.NodeRemainder {
			t.Fatalf("the nodes should differ only in their occupants: %+v vs %+v", first, second)
		}
		wa, wb := bruteLookahead(a, a.FreeSlots), bruteLookahead(b, b.FreeSlots)
		want := "b:7" // not first by name
		if wb >= wa {
			t.Fatalf("the case is meant to have b's look-ahead lower: a %.4f, b %.4f", wa, wb)
		}
		if short(first) != want || first.Lookahead >= second.Lookahead || first.Tier == second.Tier {
			t.Fatalf("want %s first (look-ahead a %.4f, b %.4f), got %v (%v, %v)", want, wa, wb, shorts(o), first.Lookahead, second.Lookahead)
		}
	}
}

// TestWholeHostCountsDoubleUpToTheGroupTerms: at the horizon a whole host weighs twice its
// share, but never more than the mix's NUMA-group (4-GPU) terms: under the default mix
// (8 GPUs 10, 4 GPUs 20) it doubles; where whole hosts are most of the demand (8 GPUs 40, 4
// GPUs 35) it stays at its share, and with no group terms at all (1 and 8 GPUs) too.
func TestWholeHostCountsDoubleUpToTheGroupTerms(t *testing.T) {
	for _, c := range []struct {
		mix  []MixEntry
		want int // the whole-host term's weight at the horizon
	}{
		{nil, 20},
		{[]MixEntry{{GPUs: 1, Weight: 10}, {GPUs: 2, Weight: 15}, {GPUs: 4, Weight: 35}, {GPUs: 8, Weight: 40}}, 40},
		{[]MixEntry{{GPUs: 4, Weight: 30}, {GPUs: 8, Weight: 20}}, 30},
		{[]MixEntry{{GPUs: 1, Weight: 80}, {GPUs: 8, Weight: 20}}, 20},
	} {
		mix, _, msg := resolveMix(c.mix)
		if msg != "" {
			t.Fatal(msg)
		}
		// A node with 2 free slots in one group: it fits neither 4 nor 8 GPUs; the
		// whole-host part of its unusable slots at the horizon is the difference from the
		// non-horizon count's whole-host part.
		now := unusableWeighted(mix, 2, 2, 8, 1)
		horizon := unusableWeighted(mix, 2, 2, 8, horizonWholeHost)
		w8 := 0
		for _, m := range mix {
			if m.policy == PolicyFullHost {
				w8 = m.weight
			}
		}
		if got := (horizon-now)/2 + w8; got != c.want {
			t.Errorf("mix %v: whole host weighs %d at the horizon, want %d", c.mix, got, c.want)
		}
	}
}
