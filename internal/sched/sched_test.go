package sched

import (
	"fmt"
	"math/rand"
	"reflect"
	"testing"
)

// node builds a node with 8 approved slots in two NUMA groups of four; free lists the free
// slot indexes; claimed counts live claims.
func node(name string, claimed int, free ...int) Node {
	n := Node{ID: "id-" + name, Name: name, GroupSize: map[int]int{0: 4, 1: 4}, ApprovedSlots: 8, ClaimedSlots: claimed}
	for _, i := range free {
		n.FreeSlots = append(n.FreeSlots, Slot{ID: fmt.Sprintf("%s-%d", name, i), SlotIndex: i, NUMANode: i / 4})
	}
	return n
}

func best(t *testing.T, o Outcome) Choice {
	t.Helper()
	if len(o.Choices) == 0 {
		t.Fatalf("no choice: %s %s", o.Reason, o.Message)
	}
	return o.Choices[0]
}

func TestRanking(t *testing.T) {
	cases := []struct {
		name      string
		gpus      int
		nodes     []Node
		wantNode  string
		wantSlots []int
	}{
		{"1 gpu on clean node takes slot 0", 1, []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7)}, "a", []int{0}},
		{"4 gpus take a whole clean group", 4, []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7)}, "a", []int{0, 1, 2, 3}},
		{"4 gpus take the only whole group", 4, []Node{node("a", 1, 1, 2, 3, 4, 5, 6, 7)}, "a", []int{4, 5, 6, 7}},
		{"1 gpu avoids clean group when a fragmented one exists", 1, []Node{node("a", 1, 1, 2, 3, 4, 5, 6, 7)}, "a", []int{1}},
		{"1 gpu prefers slice-mode node over clean node", 1, []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("b", 4, 4, 5, 6, 7)}, "b", []int{4}},
		{"2 gpus prefer best-fit fragmented group", 2, []Node{node("a", 3, 1, 2, 3, 6, 7)}, "a", []int{6, 7}},
		{"2 gpus span groups when no group has 2", 2, []Node{node("a", 6, 0, 4)}, "a", []int{0, 4}},
		{"single NUMA beats slice mode", 2, []Node{node("a", 6, 0, 4), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7)}, "b", []int{0, 1}},
		{"8 gpus need a fully free host", 8, []Node{node("a", 1, 1, 2, 3, 4, 5, 6, 7), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7)}, "b", []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"node name breaks ties", 1, []Node{node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7)}, "a", []int{0}},
		{"best fit on node among equal groups", 1, []Node{node("a", 2, 2, 3, 4, 5, 6, 7), node("b", 6, 2, 3)}, "b", []int{2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ch := best(t, PlaceSlice(Request{GPUs: c.gpus}, c.nodes))
			if ch.NodeName != c.wantNode || !reflect.DeepEqual(ch.SlotIndexes, c.wantSlots) {
				t.Fatalf("got %s %v, want %s %v (%s)", ch.NodeName, ch.SlotIndexes, c.wantNode, c.wantSlots, ch.Reason)
			}
			if len(ch.SlotIDs) != c.gpus {
				t.Fatalf("%d slot ids for %d gpus", len(ch.SlotIDs), c.gpus)
			}
		})
	}
}

func TestFourGPUsNeverSpanGroups(t *testing.T) {
	o := PlaceSlice(Request{GPUs: 4}, []Node{node("a", 2, 1, 2, 3, 5, 6, 7)})
	if len(o.Choices) != 0 || o.Reason != "topology_fragmented" || o.FreeSlots != 6 || o.MaxGroupFree != 3 || o.MaxNodeFree != 6 {
		t.Fatalf("outcome = %+v", o)
	}
}

func TestNoCapacity(t *testing.T) {
	o := PlaceSlice(Request{GPUs: 2}, []Node{node("a", 7, 3)})
	if o.Reason != "no_capacity" || o.FreeSlots != 1 {
		t.Fatalf("outcome = %+v", o)
	}
	if o := PlaceSlice(Request{GPUs: 1}, nil); o.Reason != "no_capacity" {
		t.Fatalf("empty = %+v", o)
	}
	if o := PlaceSlice(Request{GPUs: 0}, nil); o.Reason != "invalid_request" {
		t.Fatalf("zero = %+v", o)
	}
}

func TestFullHostNeedsEveryApprovedSlot(t *testing.T) {
	n := node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7)
	n.ApprovedSlots = 9 // a ninth slot exists but is not free
	if o := PlaceSlice(Request{GPUs: 8}, []Node{n}); len(o.Choices) != 0 {
		t.Fatalf("8 of 9 slots taken as a full host: %+v", o.Choices[0])
	}
}

func TestUnknownNUMA(t *testing.T) {
	n := Node{ID: "x", Name: "x", GroupSize: map[int]int{}, ApprovedSlots: 2,
		FreeSlots: []Slot{{ID: "s0", SlotIndex: 0, NUMANode: -1}, {ID: "s1", SlotIndex: 1, NUMANode: -1}}}
	ch := best(t, PlaceSlice(Request{GPUs: 1}, []Node{n}))
	if !ch.SingleNUMA || ch.SlotIndexes[0] != 0 {
		t.Fatalf("1 gpu on unknown NUMA = %+v", ch)
	}
	ch = best(t, PlaceSlice(Request{GPUs: 2}, []Node{n}))
	if ch.SingleNUMA {
		t.Fatal("two unknown-NUMA slots counted as one NUMA group")
	}
	if o := PlaceSlice(Request{GPUs: 2, Policy: PolicyNUMARequired}, []Node{n}); len(o.Choices) != 0 {
		t.Fatal("NUMA-required placed on unknown NUMA")
	}
}

func TestFullRankedListForRetries(t *testing.T) {
	o := PlaceSlice(Request{GPUs: 1}, []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7)})
	if len(o.Choices) != 4 { // one per group per node
		t.Fatalf("%d choices, want 4", len(o.Choices))
	}
	seen := map[string]bool{}
	for _, c := range o.Choices {
		if seen[c.SlotIDs[0]] {
			t.Fatalf("duplicate choice %v", c.SlotIDs)
		}
		seen[c.SlotIDs[0]] = true
	}
}

func TestDeterministicUnderPermutation(t *testing.T) {
	nodes := []Node{node("a", 2, 1, 2, 3, 5, 6, 7), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("c", 5, 0, 6, 7), node("d", 1, 0, 1, 2, 3, 5, 6, 7)}
	for _, gpus := range []int{1, 2, 4, 8} {
		want := PlaceSlice(Request{GPUs: gpus}, nodes)
		r := rand.New(rand.NewSource(int64(gpus)))
		for i := 0; i < 50; i++ {
			shuffled := make([]Node, len(nodes))
			for j, k := range r.Perm(len(nodes)) {
				n := nodes[k]
				n.FreeSlots = append([]Slot(nil), n.FreeSlots...)
				r.Shuffle(len(n.FreeSlots), func(a, b int) { n.FreeSlots[a], n.FreeSlots[b] = n.FreeSlots[b], n.FreeSlots[a] })
				shuffled[j] = n
			}
			got := PlaceSlice(Request{GPUs: gpus}, shuffled)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("gpus=%d: permutation changed the outcome:\n%+v\nvs\n%+v", gpus, got.Choices, want.Choices)
			}
		}
	}
}

func TestRankBaremetalKeepsSliceNodesForSlices(t *testing.T) {
	got := RankBaremetal([]BaremetalNode{{ID: "1", Name: "a", ApprovedSlots: 8}, {ID: "2", Name: "c"}, {ID: "3", Name: "b"}})
	var names []string
	for _, n := range got {
		names = append(names, n.Name)
	}
	if !reflect.DeepEqual(names, []string{"b", "c", "a"}) {
		t.Fatalf("order = %v", names)
	}
}

func TestDefaultPolicy(t *testing.T) {
	for gpus, want := range map[int]Policy{1: PolicyAny, 2: PolicyNUMAPreferred, 4: PolicyNUMARequired, 8: PolicyFullHost, 3: PolicyNUMAPreferred} {
		if got := DefaultPolicy(gpus); got != want {
			t.Fatalf("DefaultPolicy(%d) = %s", gpus, got)
		}
	}
}

func BenchmarkPlaceSlice(b *testing.B) {
	var nodes []Node
	for i := 0; i < 500; i++ {
		var free []int
		for s := 0; s < 8; s++ {
			if (i+s)%3 != 0 {
				free = append(free, s)
			}
		}
		nodes = append(nodes, node(fmt.Sprintf("n%03d", i), 8-len(free), free...))
	}
	for _, gpus := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("gpus=%d/nodes=500", gpus), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if o := PlaceSlice(Request{GPUs: gpus}, nodes); len(o.Choices) == 0 && gpus < 4 {
					b.Fatal("no placement")
				}
			}
		})
	}
}
