package sched

import (
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// node builds a node with 8 approved slots in two NUMA groups of four (slots 0-3 on NUMA 0,
// 4-7 on NUMA 1); free lists the free candidate slot indexes; claimed counts live claims.
func node(name string, claimed int, free ...int) Node {
	return topo(name, name, claimed, 4, 8, free...)
}

// topo builds a node with approved slots 0..approved-1 in NUMA groups of groupLen slots each.
func topo(id, name string, claimed, groupLen, approved int, free ...int) Node {
	n := Node{ID: "id-" + id, Name: name, GroupSize: map[int]int{}, ApprovedSlots: approved, ClaimedSlots: claimed}
	for i := 0; i < approved; i++ {
		n.GroupSize[i/groupLen]++
	}
	for _, i := range free {
		n.FreeSlots = append(n.FreeSlots, Slot{ID: fmt.Sprintf("%s-%d", id, i), SlotIndex: i, NUMANode: i / groupLen})
	}
	return n
}

// unknown builds a node whose listed slots have no known NUMA node.
func unknown(name string, claimed int, free ...int) Node {
	n := Node{ID: "id-" + name, Name: name, GroupSize: map[int]int{}, ApprovedSlots: 8, ClaimedSlots: claimed}
	for _, i := range free {
		n.FreeSlots = append(n.FreeSlots, Slot{ID: fmt.Sprintf("%s-%d", name, i), SlotIndex: i, NUMANode: -1})
	}
	return n
}

// short renders a choice as "node:i,j,k".
func short(c Choice) string {
	s := make([]string, len(c.SlotIndexes))
	for i, x := range c.SlotIndexes {
		s[i] = fmt.Sprint(x)
	}
	return c.NodeName + ":" + strings.Join(s, ",")
}

func shorts(o Outcome) []string { return shortsOf(o.Choices) }

func TestPlaceSlice(t *testing.T) {
	cases := []struct {
		name   string
		gpus   int
		policy Policy
		nodes  []Node
		// want is the expected ranked list, best first; exact means it must be the whole
		// list, otherwise only its first len(want) entries are checked.
		want    []string
		exact   bool
		wantIDs []string // node ids of the first choices, where names tie
		// diagnosis when want is empty
		reason                          string
		free, maxNodeFree, maxGroupFree int
		// checks on the best choice
		single, sliceMode, fragmented *bool
		rem                           []int // group and node remainder; nil: not checked
	}{
		{
			name: "4 gpus on a clean node take all of group 0, then all of group 1",
			gpus: 4, nodes: []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7)},
			want: []string{"a:0,1,2,3", "a:4,5,6,7"}, exact: true,
			single: yes, sliceMode: no, fragmented: no, rem: []int{0, 4},
		},
		{
			name: "4 gpus take the only whole group",
			gpus: 4, nodes: []Node{node("a", 1, 1, 2, 3, 4, 5, 6, 7)},
			want: []string{"a:4,5,6,7"}, exact: true,
			single: yes, sliceMode: yes, fragmented: no, rem: []int{0, 3},
		},
		{
			name: "1 gpu takes the fragmented group (3 of 4 free) and keeps the clean group whole",
			gpus: 1, nodes: []Node{node("a", 1, 1, 2, 3, 4, 5, 6, 7)},
			want: []string{"a:1", "a:4"}, exact: true,
			single: yes, sliceMode: yes, fragmented: yes, rem: []int{2, 6},
		},
		{
			name: "1 gpu prefers a node in slice mode over a tighter clean node",
			gpus: 1,
			nodes: []Node{
				topo("a", "a", 0, 1, 2, 0, 1), // clean, 2 slots: group and node remainder 0/1
				node("b", 1, 1, 2, 3, 4, 5, 6, 7),
			},
			want: []string{"b:1", "b:4", "a:0", "a:1"}, exact: true,
			single: yes, sliceMode: yes, fragmented: yes, rem: []int{2, 6},
		},
		{
			name: "2 gpus prefer a fragmented group with 2 free (remainder 0) over one with 3",
			gpus: 2, nodes: []Node{node("a", 3, 1, 2, 3, 6, 7)},
			want: []string{"a:6,7", "a:1,2"}, exact: true,
			single: yes, sliceMode: yes, fragmented: yes, rem: []int{0, 3},
		},
		{
			// b has no whole group left, so its holes are unusable for 4 and 8 GPUs (-0.30);
			// a keeps a whole group, its holes only miss 8 (-0.10). Best fit alone chose a:2.
			name: "the smallest fragmentation change ranks before best fit",
			gpus: 1,
			nodes: []Node{
				node("a", 2, 2, 3, 4, 5, 6, 7), // group 0: 2 of 4 free
				node("b", 5, 1, 2, 3),          // group 0: 3 of 4 free
			},
			want: []string{"b:1", "a:2", "a:4"}, exact: true,
			fragmented: yes, rem: []int{2, 2},
		},
		{
			name: "a fragmented group beats a tighter clean group",
			gpus: 1,
			nodes: []Node{func() Node {
				n := node("a", 1, 1, 2, 3, 4, 5)       // group 0: 3 of 4 free
				n.GroupSize[1], n.ApprovedSlots = 2, 6 // group 1: 2 of 2 free
				return n
			}()},
			want: []string{"a:1", "a:4"}, exact: true,
			fragmented: yes, rem: []int{2, 4},
		},
		{
			name: "spanning takes the fullest groups first",
			gpus: 6, policy: PolicyNUMAPreferred,
			nodes: []Node{topo("s", "s", 8, 4, 16, 0, 4, 5, 8, 9, 10, 12, 13)}, // free per group: 1, 2, 3, 2
			want:  []string{"s:4,5,8,9,10,12"}, exact: true,
			single: no, fragmented: yes, rem: []int{1, 2},
		},
		{
			name: "spanning breaks equal group sizes by lowest NUMA id",
			gpus: 5, policy: PolicyNUMAPreferred,
			nodes: []Node{topo("s", "s", 8, 4, 16, 0, 4, 5, 8, 9, 10, 12, 13)},
			want:  []string{"s:4,5,8,9,10"}, exact: true,
			rem: []int{0, 3},
		},
		{
			// Every choice changes fragmentation by -0.30; c:1 leaves 2 in its group.
			name: "node remainder breaks a group remainder tie",
			gpus: 1,
			nodes: []Node{
				node("c", 3, 1, 2, 3, 6, 7),
				node("a", 4, 2, 3, 6, 7),
			},
			want: []string{"a:2", "a:6", "c:6", "c:1"}, exact: true,
			rem: []int{1, 3},
		},
		{
			name: "4 gpus with 3+3 free fail as topology_fragmented",
			gpus: 4, nodes: []Node{node("a", 2, 1, 2, 3, 5, 6, 7)},
			reason: ReasonTopologyFragmented, free: 6, maxNodeFree: 6, maxGroupFree: 3,
		},
		{
			name: "4 gpus with an explicit any policy span 3+3, largest groups then NUMA id",
			gpus: 4, policy: PolicyAny, nodes: []Node{node("a", 2, 1, 2, 3, 5, 6, 7)},
			want: []string{"a:1,2,3,5"}, exact: true,
			single: no, sliceMode: yes, fragmented: yes, rem: []int{2, 2},
		},
		{
			name: "8 gpus only match a fully free 8-slot node",
			gpus: 8,
			nodes: []Node{
				node("a", 1, 1, 2, 3, 4, 5, 6, 7),
				node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7),
				topo("c", "c", 0, 4, 9, 0, 1, 2, 3, 4, 5, 6, 7), // 8 free of 9 approved
			},
			want: []string{"b:0,1,2,3,4,5,6,7"}, exact: true,
			single: no, sliceMode: no, fragmented: no, rem: []int{0, 0},
		},
		{
			name: "8 gpus on no fully free node: topology_fragmented",
			gpus: 8,
			nodes: []Node{
				node("a", 1, 1, 2, 3, 4, 5, 6, 7),
				topo("c", "c", 0, 4, 9, 0, 1, 2, 3, 4, 5, 6, 7),
			},
			reason: ReasonTopologyFragmented, free: 15, maxNodeFree: 8, maxGroupFree: 4,
		},
		{
			name: "explicit full_host on a 4-slot node",
			gpus: 4, policy: PolicyFullHost,
			nodes: []Node{topo("s", "s", 0, 2, 4, 0, 1, 2, 3), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7)},
			want:  []string{"s:0,1,2,3"}, exact: true,
		},
		{
			name: "2 gpus NUMA-preferred span groups when no group has 2 free",
			gpus: 2, nodes: []Node{node("a", 6, 0, 4)},
			want: []string{"a:0,4"}, exact: true,
			single: no, sliceMode: yes, fragmented: yes, rem: []int{0, 0},
		},
		{
			name: "2 gpus NUMA-preferred do not span on a node where one group fits",
			gpus: 2, nodes: []Node{node("a", 5, 0, 1, 4)},
			want: []string{"a:0,1"}, exact: true,
		},
		{
			name: "single NUMA on a clean node beats spanning on a slice-mode node",
			gpus: 2, nodes: []Node{node("a", 6, 0, 4), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7)},
			want: []string{"b:0,1", "b:4,5", "a:0,4"}, exact: true,
		},
		{
			name: "2 gpus NUMA-required never span",
			gpus: 2, policy: PolicyNUMARequired, nodes: []Node{node("a", 6, 0, 4)},
			reason: ReasonTopologyFragmented, free: 2, maxNodeFree: 2, maxGroupFree: 1,
		},
		{
			name:  "spanning fills the fullest group first, then the lowest NUMA id",
			gpus:  3,
			nodes: []Node{topo("r", "r", 1, 2, 8, 0, 2, 3, 6)}, // groups of 2: 0 has 1, 1 has 2, 3 has 1
			want:  []string{"r:0,2,3"}, exact: true,
			single: no, fragmented: yes, rem: []int{0, 1},
		},
		{
			name: "fewest groups ranks before node name",
			gpus: 3,
			nodes: []Node{
				topo("p", "p", 5, 2, 8, 0, 2, 4), // three groups of one
				topo("q", "q", 5, 2, 8, 0, 1, 2), // group 0 whole plus one
			},
			want: []string{"q:0,1,2", "p:0,2,4"}, exact: true,
		},
		{
			name: "node name then id break ties",
			gpus: 1,
			nodes: []Node{
				topo("z", "b", 0, 4, 4, 0, 1, 2, 3),
				topo("y", "a", 0, 4, 4, 0, 1, 2, 3),
				topo("2", "a", 0, 4, 4, 0, 1, 2, 3),
			},
			want: []string{"a:0", "a:0", "b:0"}, exact: true,
			wantIDs: []string{"id-2", "id-y", "id-z"},
		},
		{
			name: "1 gpu on unknown NUMA is single and fine",
			gpus: 1, nodes: []Node{unknown("u", 0, 3, 1)},
			want: []string{"u:1", "u:3"}, exact: true,
			single: yes, sliceMode: no, fragmented: no, rem: []int{0, 1},
		},
		{
			name: "2 gpus on unknown NUMA span, never single",
			gpus: 2, nodes: []Node{unknown("u", 0, 3, 1, 5)},
			want: []string{"u:1,3"}, exact: true,
			single: no, rem: []int{0, 1},
		},
		{
			name: "2 gpus NUMA-required refuse unknown NUMA",
			gpus: 2, policy: PolicyNUMARequired, nodes: []Node{unknown("u", 0, 0, 1)},
			reason: ReasonTopologyFragmented, free: 2, maxNodeFree: 2, maxGroupFree: 1,
		},
		{
			name: "spanning takes known groups before unknown-NUMA slots",
			gpus: 2,
			nodes: []Node{func() Node {
				n := node("m", 6, 6)
				n.FreeSlots = append(n.FreeSlots, Slot{ID: "m-x", SlotIndex: 0, NUMANode: -1})
				n.FreeSlots = append(n.FreeSlots, Slot{ID: "m-y", SlotIndex: 1, NUMANode: -1})
				return n
			}()},
			want: []string{"m:0,6"}, exact: true, single: no, rem: []int{0, 1},
		},
		{
			name: "not enough free slots anywhere: no_capacity",
			gpus: 2, nodes: []Node{node("a", 7, 3)},
			reason: ReasonNoCapacity, free: 1, maxNodeFree: 1, maxGroupFree: 1,
		},
		{
			name: "empty input: no_capacity", gpus: 1,
			reason: ReasonNoCapacity,
		},
		{
			name: "zero gpus: invalid_request", gpus: 0, nodes: []Node{node("a", 0, 0)},
			reason: ReasonInvalidRequest,
		},
		{
			name: "negative gpus: invalid_request", gpus: -3, nodes: []Node{node("a", 0, 0)},
			reason: ReasonInvalidRequest,
		},
		{
			name: "unknown policy: invalid_request", gpus: 1, policy: "numa-ish", nodes: []Node{node("a", 0, 0)},
			reason: ReasonInvalidRequest,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := PlaceSlice(Request{GPUs: c.gpus, Policy: c.policy}, c.nodes)
			got := shorts(o)
			if len(c.want) == 0 {
				if len(o.Choices) != 0 {
					t.Fatalf("choices %v, want none (%s)", got, o.Choices[0].Reason)
				}
				if o.Reason != c.reason || o.FreeSlots != c.free || o.MaxNodeFree != c.maxNodeFree || o.MaxGroupFree != c.maxGroupFree {
					t.Fatalf("diagnosis = %q free=%d node=%d group=%d, want %q %d %d %d",
						o.Reason, o.FreeSlots, o.MaxNodeFree, o.MaxGroupFree, c.reason, c.free, c.maxNodeFree, c.maxGroupFree)
				}
				if o.Message == "" {
					t.Fatal("empty diagnosis message")
				}
				return
			}
			if o.Reason != "" || o.Message != "" {
				t.Fatalf("reason %q message %q with choices", o.Reason, o.Message)
			}
			if c.exact && !reflect.DeepEqual(got, c.want) {
				t.Fatalf("choices %v, want %v", got, c.want)
			}
			if !c.exact && (len(got) < len(c.want) || !reflect.DeepEqual(got[:len(c.want)], c.want)) {
				t.Fatalf("choices %v, want prefix %v", got, c.want)
			}
			for i, id := range c.wantIDs {
				if o.Choices[i].NodeID != id {
					t.Fatalf("choice %d on node id %s, want %s", i, o.Choices[i].NodeID, id)
				}
			}
			b := o.Choices[0]
			check := func(what string, want *bool, got bool) {
				if want != nil && *want != got {
					t.Errorf("%s = %v, want %v (%s)", what, got, *want, b.Reason)
				}
			}
			check("SingleNUMA", c.single, b.SingleNUMA)
			check("NodeInSliceMode", c.sliceMode, b.NodeInSliceMode)
			check("GroupFragmented", c.fragmented, b.GroupFragmented)
			if c.rem != nil && (b.GroupRemainder != c.rem[0] || b.NodeRemainder != c.rem[1]) {
				t.Errorf("remainders group=%d node=%d, want %v (%s)", b.GroupRemainder, b.NodeRemainder, c.rem, b.Reason)
			}
			for _, ch := range o.Choices {
				validChoice(t, Request{GPUs: c.gpus, Policy: c.policy}, c.nodes, ch)
			}
		})
	}
}

var (
	yes = ptr(true)
	no  = ptr(false)
)

func ptr(b bool) *bool { return &b }

// validChoice checks a choice's invariants against its input.
func validChoice(t *testing.T, req Request, nodes []Node, c Choice) {
	t.Helper()
	policy := req.Policy
	if policy == "" {
		policy = DefaultPolicy(req.GPUs)
	}
	var nd *Node
	for i := range nodes {
		if nodes[i].ID == c.NodeID {
			nd = &nodes[i]
		}
	}
	if nd == nil || nd.Name != c.NodeName {
		t.Fatalf("choice on unknown node %s/%s", c.NodeID, c.NodeName)
	}
	if len(c.SlotIDs) != req.GPUs || len(c.SlotIndexes) != req.GPUs {
		t.Fatalf("%d slots for %d gpus: %+v", len(c.SlotIDs), req.GPUs, c)
	}
	byID := map[string]Slot{}
	for _, s := range nd.FreeSlots {
		byID[s.ID] = s
	}
	numas := map[int]bool{}
	seen := map[string]bool{}
	for i, id := range c.SlotIDs {
		s, ok := byID[id]
		if !ok || seen[id] {
			t.Fatalf("slot %s not free on %s or repeated: %+v", id, nd.Name, c)
		}
		seen[id] = true
		if s.SlotIndex != c.SlotIndexes[i] || (i > 0 && c.SlotIndexes[i-1] > s.SlotIndex) {
			t.Fatalf("slot ids and indexes disagree or unsorted: %+v", c)
		}
		numas[max(s.NUMANode, -1)] = true
	}
	var want []int
	for k := range numas {
		want = append(want, k)
	}
	sortInts(want)
	if !reflect.DeepEqual(want, c.NUMANodes) {
		t.Fatalf("NUMANodes %v, want %v", c.NUMANodes, want)
	}
	if c.SingleNUMA && (len(c.NUMANodes) != 1 || (c.NUMANodes[0] < 0 && req.GPUs > 1)) {
		t.Fatalf("SingleNUMA on %v for %d gpus", c.NUMANodes, req.GPUs)
	}
	if policy == PolicyNUMARequired && !c.SingleNUMA {
		t.Fatalf("numa_required placed across groups: %+v", c)
	}
	if policy == PolicyFullHost && (len(nd.FreeSlots) != req.GPUs || nd.ApprovedSlots != req.GPUs) {
		t.Fatalf("full host on a node with %d free of %d approved", len(nd.FreeSlots), nd.ApprovedSlots)
	}
	if c.NodeRemainder != len(nd.FreeSlots)-req.GPUs || c.NodeInSliceMode != (nd.ClaimedSlots > 0) {
		t.Fatalf("node facts wrong: %+v", c)
	}
	if c.Reason == "" || !strings.Contains(c.Reason, nd.Name) {
		t.Fatalf("reason %q does not name node %s", c.Reason, nd.Name)
	}
	if req.Mix == nil {
		after := map[int]int{}
		for _, s := range nd.FreeSlots {
			if !seen[s.ID] {
				after[max(s.NUMANode, -1)]++
			}
		}
		want := expectedUnusable(nd.FreeSlots, after, len(nd.FreeSlots)-req.GPUs, nd.ApprovedSlots) -
			expectedUnusable(nd.FreeSlots, nil, len(nd.FreeSlots), nd.ApprovedSlots)
		if d := c.FragmentationDelta - want; d < -1e-9 || d > 1e-9 {
			t.Fatalf("FragmentationDelta %v, want %v: %+v", c.FragmentationDelta, want, c)
		}
	}
}

// expectedUnusable recomputes the FGD measure of a node under the default mix, written out
// independently of the code under test: the 40/30/20/10% shares of 1, 2, 4 and 8 GPUs, each
// counting the node's free slots when that size no longer fits. perGroup holds the free
// slots per known NUMA group (nil: count them from slots); unknown-NUMA slots are groups of
// one.
func expectedUnusable(slots []Slot, perGroup map[int]int, free, approved int) float64 {
	if perGroup == nil {
		perGroup = map[int]int{}
		for _, s := range slots {
			perGroup[max(s.NUMANode, -1)]++
		}
	}
	largest := 0
	for numa, k := range perGroup {
		if numa < 0 {
			k = min(k, 1)
		}
		largest = max(largest, k)
	}
	u := 0.0
	if free < 1 {
		u += 0.4 * float64(free)
	}
	if free < 2 {
		u += 0.3 * float64(free)
	}
	if largest < 4 {
		u += 0.2 * float64(free)
	}
	if !(free == 8 && approved == 8) {
		u += 0.1 * float64(free)
	}
	return u
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func TestReasonStrings(t *testing.T) {
	o := PlaceSlice(Request{GPUs: 1}, []Node{node("n1", 1, 1, 2, 3, 4, 5, 6, 7)})
	want := "single NUMA group 0 on node n1 (node in slice mode, fragmented group, fragmentation change -0.10, look-ahead -0.19, group remainder 2, node remainder 6)"
	if o.Choices[0].Reason != want {
		t.Fatalf("reason %q, want %q", o.Choices[0].Reason, want)
	}
	o = PlaceSlice(Request{GPUs: 2}, []Node{node("n1", 6, 0, 4)})
	want = "spans 2 NUMA groups (0, 1) on node n1, no single group has 2 free (node in slice mode, fragmented groups, fragmentation change -0.60, look-ahead -0.84, group remainder 0, node remainder 0)"
	if o.Choices[0].Reason != want {
		t.Fatalf("reason %q, want %q", o.Choices[0].Reason, want)
	}
	o = PlaceSlice(Request{GPUs: 8}, []Node{node("n1", 0, 0, 1, 2, 3, 4, 5, 6, 7)})
	want = "full host n1: all 8 approved slots free (clean node, fragmentation change +0.00, look-ahead +0.00)"
	if o.Choices[0].Reason != want {
		t.Fatalf("reason %q, want %q", o.Choices[0].Reason, want)
	}
}

func TestDiagnosisMessages(t *testing.T) {
	nodes := []Node{node("a", 2, 1, 2, 3, 5, 6, 7), node("b", 5, 0, 1, 4), node("c", 8)}
	o := PlaceSlice(Request{GPUs: 4}, nodes)
	want := "9 slots are free across 2 nodes, but no node offers 4 slots in one NUMA group (largest: 3)"
	if o.Reason != ReasonTopologyFragmented || o.Message != want {
		t.Fatalf("got %q %q, want %q", o.Reason, o.Message, want)
	}
	o = PlaceSlice(Request{GPUs: 7, Policy: PolicyNUMAPreferred}, nodes)
	want = "9 slots are free across 2 nodes, but no node offers 7 free slots (largest: 6)"
	if o.Reason != ReasonTopologyFragmented || o.Message != want {
		t.Fatalf("got %q %q, want %q", o.Reason, o.Message, want)
	}
	o = PlaceSlice(Request{GPUs: 8}, nodes)
	if o.Reason != ReasonTopologyFragmented || !strings.Contains(o.Message, "exactly 8 approved slots all free") {
		t.Fatalf("got %q %q", o.Reason, o.Message)
	}
	o = PlaceSlice(Request{GPUs: 10}, nodes)
	want = "only 9 slots are free across 2 nodes; 10 requested"
	if o.Reason != ReasonNoCapacity || o.Message != want {
		t.Fatalf("got %q %q, want %q", o.Reason, o.Message, want)
	}
}

func TestFullHostNeedsEveryApprovedSlot(t *testing.T) {
	n := node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7)
	n.ApprovedSlots = 9 // a ninth slot exists but is not a candidate
	if o := PlaceSlice(Request{GPUs: 8}, []Node{n}); len(o.Choices) != 0 {
		t.Fatalf("8 of 9 slots taken as a full host: %+v", o.Choices[0])
	}
	// 8 free on a 16-slot node is not a full host either, even though 8 are free.
	big := topo("big", "big", 0, 8, 16, 0, 1, 2, 3, 4, 5, 6, 7)
	if o := PlaceSlice(Request{GPUs: 8}, []Node{big}); len(o.Choices) != 0 {
		t.Fatalf("half of a 16-slot node taken as a full host: %+v", o.Choices[0])
	}
}

// A window's ranking is settled only when its best choice is as local as any node could
// offer: one NUMA group, or a full host; spans and nothing are not.
func TestSettled(t *testing.T) {
	spans := []Node{node("a", 6, 3, 7), node("b", 6, 2, 6)}
	for _, c := range []struct {
		name  string
		req   Request
		nodes []Node
		want  bool
	}{
		{"only spans", Request{GPUs: 2}, spans, false},
		{"a group beside spans", Request{GPUs: 2}, append(spans[:2:2], node("c", 5, 5, 6, 7)), true},
		{"one slot", Request{GPUs: 1}, spans, true},
		{"full host", Request{GPUs: 8}, []Node{node("d", 0, 0, 1, 2, 3, 4, 5, 6, 7)}, true},
		{"nothing fits", Request{GPUs: 4}, spans, false},
		{"invalid request", Request{GPUs: 0}, spans, false},
	} {
		o := PlaceSlice(c.req, c.nodes)
		if got := o.Settled(); got != c.want {
			t.Errorf("%s: settled %v, want %v (%s)", c.name, got, c.want, Explain(o))
		}
		if len(o.Choices) > 0 && o.Choices[0].FullHost != (c.req.GPUs == 8) {
			t.Errorf("%s: FullHost %v on %s", c.name, o.Choices[0].FullHost, o.Choices[0].Reason)
		}
	}
}

// TestPackingKeepsWholeGroups places requests one after another the way the controller
// would and checks that small requests pack into broken groups, leaving whole groups for
// 4-GPU requests and whole clean nodes for 8-GPU requests.
func TestPackingKeepsWholeGroups(t *testing.T) {
	nodes := []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7)}
	steps := []struct {
		gpus int
		want string
	}{
		{2, "a:0,1"},     // clean nodes only: first by name
		{1, "a:2"},       // slice-mode node a, fragmented group 0
		{1, "a:3"},       // fills group 0
		{2, "a:4,5"},     // slice-mode node a before clean b; group 1 breaks only now
		{4, "b:0,1,2,3"}, // a has no whole group left; b's clean group 0
		{8, ""},          // b is no longer whole
	}
	for i, s := range steps {
		o := PlaceSlice(Request{GPUs: s.gpus}, nodes)
		got := ""
		if len(o.Choices) > 0 {
			got = short(o.Choices[0])
			take(nodes, o.Choices[0])
		}
		if got != s.want {
			t.Fatalf("step %d (%d gpus): got %q, want %q (%v)", i, s.gpus, got, s.want, shorts(o))
		}
	}
}

// take removes a choice's slots from the free lists and claims them, as a reservation would.
func take(nodes []Node, c Choice) {
	taken := map[string]bool{}
	for _, id := range c.SlotIDs {
		taken[id] = true
	}
	for i := range nodes {
		if nodes[i].ID != c.NodeID {
			continue
		}
		var kept []Slot
		for _, s := range nodes[i].FreeSlots {
			if !taken[s.ID] {
				kept = append(kept, s)
			}
		}
		nodes[i].FreeSlots = kept
		nodes[i].ClaimedSlots += len(c.SlotIDs)
	}
}

func TestFullRankedListForRetries(t *testing.T) {
	o := PlaceSlice(Request{GPUs: 1}, []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7)})
	want := []string{"a:0", "b:0", "a:4", "b:4"} // one per group per node, first slot index before name
	if got := shorts(o); !reflect.DeepEqual(got, want) {
		t.Fatalf("choices %v, want %v", got, want)
	}
}

func shuffled(r *rand.Rand, nodes []Node) []Node {
	out := make([]Node, len(nodes))
	for j, k := range r.Perm(len(nodes)) {
		n := nodes[k]
		n.FreeSlots = append([]Slot(nil), n.FreeSlots...)
		r.Shuffle(len(n.FreeSlots), func(a, b int) { n.FreeSlots[a], n.FreeSlots[b] = n.FreeSlots[b], n.FreeSlots[a] })
		out[j] = n
	}
	return out
}

func TestDeterministicUnderPermutation(t *testing.T) {
	mixed := unknown("u", 1, 0, 1)
	mixed.FreeSlots = append(mixed.FreeSlots, Slot{ID: "u-4", SlotIndex: 4, NUMANode: 1}, Slot{ID: "u-5", SlotIndex: 5, NUMANode: 1})
	mixed.GroupSize[1] = 4
	nodes := []Node{
		node("a", 2, 1, 2, 3, 5, 6, 7), node("b", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("c", 5, 0, 6, 7),
		node("d", 1, 0, 1, 2, 3, 5, 6, 7), topo("e1", "e", 0, 4, 8, 0, 1, 2, 3, 4, 5, 6, 7),
		topo("e0", "e", 0, 4, 8, 0, 1, 2, 3, 4, 5, 6, 7), topo("p", "p", 5, 2, 8, 0, 2, 4), mixed,
	}
	r := rand.New(rand.NewSource(1))
	for _, gpus := range []int{1, 2, 3, 4, 8} {
		for _, policy := range []Policy{"", PolicyAny, PolicyNUMAPreferred, PolicyNUMARequired, PolicyFullHost} {
			req := Request{GPUs: gpus, Policy: policy}
			want := PlaceSlice(req, nodes)
			for i := 0; i < 30; i++ {
				got := PlaceSlice(req, shuffled(r, nodes))
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("gpus=%d policy=%q: permutation changed the outcome:\n%v\nvs\n%v", gpus, policy, shorts(got), shorts(want))
				}
			}
		}
	}
}

// TestRandomTopologies checks invariants and permutation stability on random inputs.
func TestRandomTopologies(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	for iter := 0; iter < 300; iter++ {
		var nodes []Node
		for k := 0; k < 1+r.Intn(6); k++ {
			groupLen := []int{1, 2, 4, 8}[r.Intn(4)]
			approved := []int{4, 8, 8, 16}[r.Intn(4)]
			var free []int
			for s := 0; s < approved; s++ {
				if r.Intn(3) > 0 {
					free = append(free, s)
				}
			}
			n := topo(fmt.Sprintf("n%d", k), fmt.Sprintf("node%d", r.Intn(3)), approved-len(free), groupLen, approved, free...)
			for i := range n.FreeSlots {
				if r.Intn(10) == 0 {
					n.FreeSlots[i].NUMANode = -1
				}
			}
			nodes = append(nodes, n)
		}
		for _, gpus := range []int{1, 2, 3, 4, 8} {
			for _, policy := range []Policy{"", PolicyAny, PolicyNUMARequired} {
				req := Request{GPUs: gpus, Policy: policy}
				o := PlaceSlice(req, nodes)
				for _, c := range o.Choices {
					validChoice(t, req, nodes, c)
				}
				for i := 1; i < len(o.Choices); i++ {
					a, b := o.Choices[i-1], o.Choices[i]
					if a.SingleNUMA != b.SingleNUMA && !a.SingleNUMA {
						t.Fatalf("spanning choice ranked before single NUMA: %v", shorts(o))
					}
					if a.SingleNUMA == b.SingleNUMA && a.NodeInSliceMode == b.NodeInSliceMode &&
						a.Lookahead > b.Lookahead+1e-9 {
						t.Fatalf("look-ahead %v ranked before %v: %v", a.Lookahead, b.Lookahead, shorts(o))
					}
				}
				if len(o.Choices) == 0 {
					total := 0
					for _, n := range nodes {
						total += len(n.FreeSlots)
					}
					wantReason := ReasonNoCapacity
					if total >= gpus {
						wantReason = ReasonTopologyFragmented
					}
					if o.Reason != wantReason || o.FreeSlots != total {
						t.Fatalf("diagnosis %q free=%d, want %q %d", o.Reason, o.FreeSlots, wantReason, total)
					}
				}
				if got := PlaceSlice(req, shuffled(r, nodes)); !reflect.DeepEqual(got, o) {
					t.Fatalf("permutation changed the outcome:\n%v\nvs\n%v", shorts(got), shorts(o))
				}
			}
		}
	}
}

func TestInputNotModified(t *testing.T) {
	nodes := []Node{node("a", 0, 7, 6, 5, 4, 3, 2, 1, 0)}
	before := append([]Slot(nil), nodes[0].FreeSlots...)
	PlaceSlice(Request{GPUs: 3}, nodes)
	if !reflect.DeepEqual(before, nodes[0].FreeSlots) {
		t.Fatal("PlaceSlice reordered the caller's slots")
	}
}

func TestExplain(t *testing.T) {
	o := PlaceSlice(Request{GPUs: 1}, []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("b", 1, 1, 2, 3, 4, 5, 6, 7)})
	got := Explain(o)
	lines := strings.Split(got, "\n")
	if len(lines) != 5 || lines[0] != "4 ranked choices, best first:" || !strings.HasPrefix(lines[1], "1. slots [1]: single NUMA group 0 on node b") || lines[4] != "... and 1 more" {
		t.Fatalf("explain:\n%s", got)
	}
	got = Explain(PlaceSlice(Request{GPUs: 4}, []Node{node("a", 2, 1, 2, 3, 5, 6, 7)}))
	want := "no placement: topology_fragmented\n" +
		"6 slots are free across 1 node, but no node offers 4 slots in one NUMA group (largest: 3)\n" +
		"free slots: 6, most on one node: 6, most in one NUMA group: 3"
	if got != want {
		t.Fatalf("explain:\n%s\nwant:\n%s", got, want)
	}
	if got := Explain(PlaceSlice(Request{GPUs: 0}, nil)); !strings.HasPrefix(got, "no placement: invalid_request") {
		t.Fatalf("explain: %s", got)
	}
}

func TestRankBaremetalKeepsSliceNodesForSlices(t *testing.T) {
	in := []BaremetalNode{{ID: "1", Name: "a", ApprovedSlots: 8}, {ID: "2", Name: "c"}, {ID: "4", Name: "b"}, {ID: "3", Name: "b"}}
	got := RankBaremetal(in)
	var ids []string
	for _, n := range got {
		ids = append(ids, n.ID)
	}
	if !reflect.DeepEqual(ids, []string{"3", "4", "2", "1"}) {
		t.Fatalf("order = %v", ids)
	}
	if in[0].ID != "1" {
		t.Fatal("RankBaremetal modified its input")
	}
	if len(RankBaremetal(nil)) != 0 {
		t.Fatal("nil input")
	}
}

// TestMixOverride checks that a request's own demand mix replaces the default one: with
// only 8-GPU requests expected, every hole on a broken node costs the same, and best fit
// decides again.
func TestMixOverride(t *testing.T) {
	nodes := []Node{
		node("a", 3, 3, 4, 5, 6, 7), // group 0: one hole; group 1 whole
		node("b", 2, 1, 2, 3, 5, 6, 7),
	}
	if got := short(PlaceSlice(Request{GPUs: 1}, nodes).Choices[0]); got != "b:1" {
		t.Fatalf("default mix chose %s, want b:1 (b's holes are useless to 4 GPUs, a's are not)", got)
	}
	o := PlaceSlice(Request{GPUs: 1, Mix: []MixEntry{{GPUs: 8, Weight: 1}}}, nodes)
	if got := short(o.Choices[0]); got != "a:3" {
		t.Fatalf("8-GPU-only mix chose %s, want a:3 (%s)", got, o.Choices[0].Reason)
	}
	if d := o.Choices[0].FragmentationDelta; d != -1 {
		t.Fatalf("FragmentationDelta %v under an 8-GPU-only mix, want -1", d)
	}
	// The same mix given explicitly ranks exactly like the default.
	want := PlaceSlice(Request{GPUs: 2}, nodes)
	if got := PlaceSlice(Request{GPUs: 2, Mix: DefaultMix()}, nodes); !reflect.DeepEqual(got, want) {
		t.Fatalf("explicit default mix: %v, want %v", shorts(got), shorts(want))
	}
	// Weights are relative: scaling them changes nothing.
	scaled := DefaultMix()
	for i := range scaled {
		scaled[i].Weight *= 7
	}
	if got := PlaceSlice(Request{GPUs: 2, Mix: scaled}, nodes); !sameUpToRounding(got, want) {
		t.Fatalf("scaled mix: %v, want %v", shorts(got), shorts(want))
	}
}

// sameUpToRounding is reflect.DeepEqual, except that each choice's Lookahead may differ by one
// unit of the score's fixed point (scoreUnit, over the mix's total weight): a third of the FGD
// change is not exact, and a scaled mix rounds it at a different place.
func sameUpToRounding(a, b Outcome) bool {
	if len(a.Choices) != len(b.Choices) {
		return false
	}
	a.Choices = slices.Clone(a.Choices)
	for i := range a.Choices {
		if math.Abs(a.Choices[i].Lookahead-b.Choices[i].Lookahead) > scoreUnit {
			return false
		}
		a.Choices[i].Lookahead = b.Choices[i].Lookahead
	}
	return reflect.DeepEqual(a, b)
}

func TestInvalidMix(t *testing.T) {
	nodes := []Node{node("a", 0, 0, 1, 2, 3, 4, 5, 6, 7)}
	for name, mix := range map[string][]MixEntry{
		"empty":            {},
		"zero gpus":        {{GPUs: 0, Weight: 1}},
		"negative weight":  {{GPUs: 1, Weight: -1}},
		"zero weight":      {{GPUs: 1}},
		"huge weight":      {{GPUs: 1, Weight: maxMixWeight + 1}},
		"weights overflow": {{GPUs: 1, Weight: maxMixWeight}, {GPUs: 2, Weight: 1}},
		"unknown policy":   {{GPUs: 2, Policy: "numa-ish", Weight: 1}},
	} {
		o := PlaceSlice(Request{GPUs: 1, Mix: mix}, nodes)
		if len(o.Choices) != 0 || o.Reason != ReasonInvalidRequest || !strings.Contains(o.Message, "demand mix") {
			t.Errorf("%s: %v %q %q", name, shorts(o), o.Reason, o.Message)
		}
	}
}

// TestFragmentationDeltaByState pins the FGD numbers of the default mix on an 8-slot node
// with two groups of four, from the free slots per group before the pick.
func TestFragmentationDeltaByState(t *testing.T) {
	cases := []struct {
		gpus int
		free []int
		want string // best choice
		d    float64
	}{
		{1, []int{0, 1, 2, 3, 4, 5, 6, 7}, "n:0", 0.7}, // (4,4) -> (4,3): 7 free now miss 8
		{1, []int{3}, "n:3", -0.6},                     // (1,0) -> (0,0): the last, nearly useless slot
		{1, []int{1, 2, 3, 5, 6, 7}, "n:1", -0.3},      // (3,3) -> (2,3)
		{1, []int{3, 4, 5, 6, 7}, "n:3", -0.1},         // (1,4) -> (0,4): keeps the whole group
		{2, []int{2, 3, 4, 5, 6, 7}, "n:2,3", -0.2},    // (2,4) -> (0,4)
		{2, []int{0, 1, 2, 3}, "n:0,1", 0.2},           // (4,0) -> (2,0): 4 GPUs no longer fit
		{4, []int{0, 1, 2, 3}, "n:0,1,2,3", -0.4},      // (4,0) -> (0,0)
		{4, []int{0, 1, 2, 3, 4, 5, 6, 7}, "n:0,1,2,3", 0.4},
		{8, []int{0, 1, 2, 3, 4, 5, 6, 7}, "n:0,1,2,3,4,5,6,7", 0},
	}
	for _, c := range cases {
		o := PlaceSlice(Request{GPUs: c.gpus}, []Node{node("n", 8-len(c.free), c.free...)})
		if len(o.Choices) == 0 {
			t.Errorf("%d gpus on %v: no choice", c.gpus, c.free)
			continue
		}
		b := o.Choices[0]
		if short(b) != c.want || b.FragmentationDelta < c.d-1e-9 || b.FragmentationDelta > c.d+1e-9 {
			t.Errorf("%d gpus on %v: %s with change %v, want %s with %v", c.gpus, c.free, short(b), b.FragmentationDelta, c.want, c.d)
		}
	}
}

func TestSigned2(t *testing.T) {
	for _, c := range []struct {
		num, den int
		want     string
	}{
		{70, 100, "+0.70"}, {-30, 100, "-0.30"}, {0, 100, "+0.00"}, {-1, 1000, "+0.00"}, {5, 1000, "+0.01"},
		{1, 3, "+0.33"}, {-2, 3, "-0.67"}, {250, 100, "+2.50"}, {-1234, 10, "-123.40"}, {3, 0, "+0.00"},
	} {
		if got := signed2(c.num, c.den); got != c.want {
			t.Errorf("signed2(%d, %d) = %q, want %q", c.num, c.den, got, c.want)
		}
	}
}

func TestDefaultPolicy(t *testing.T) {
	for gpus, want := range map[int]Policy{1: PolicyAny, 2: PolicyNUMAPreferred, 4: PolicyNUMARequired, 8: PolicyFullHost, 3: PolicyNUMAPreferred, 16: PolicyNUMAPreferred, 0: PolicyNUMAPreferred} {
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
			if i%5 == 0 || (i+s)%3 != 0 {
				free = append(free, s)
			}
		}
		nodes = append(nodes, node(fmt.Sprintf("n%03d", i), 8-len(free), free...))
	}
	for _, gpus := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("gpus=%d/nodes=500x8", gpus), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if o := PlaceSlice(Request{GPUs: gpus}, nodes); len(o.Choices) == 0 {
					b.Fatal("no placement")
				}
			}
		})
	}
}

// BenchmarkPlaceSliceWindow is one busy window as the controller ranks it: WindowNodes nodes,
// each with its live allocations (the look-ahead's input), 1 to 6 of them.
func BenchmarkPlaceSliceWindow(b *testing.B) {
	shapes := [][][]int{
		{{0, 1, 2, 3}, {4, 5}, {6}},
		{{0, 1}, {2, 3}, {4}, {5}, {6}},
		{{0}, {1}, {2}, {3}, {4, 5}, {6}},
		{{0, 1, 2, 3}, {4, 5, 6, 7}},
		{{0, 1}, {2}},
	}
	var nodes []Node
	for i := range WindowNodes {
		nodes = append(nodes, occupied(fmt.Sprintf("n%02d", i), shapes[i%len(shapes)]...))
	}
	for _, gpus := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("gpus=%d/nodes=%d", gpus, len(nodes)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if o := PlaceSlice(Request{GPUs: gpus}, nodes); len(o.Choices) == 0 {
					b.Fatal("no placement")
				}
			}
		})
	}
}

// Equally good choices share a tier and only they do; SpreadTies keeps the best choice
// first and the tiers in order and shuffles the rest inside each tier, so every other
// member of a tier is sometimes tried right after the ones before it.
func TestTiersAndSpreadTies(t *testing.T) {
	nodes := []Node{node("c1", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("half", 4, 4, 5, 6, 7),
		node("c2", 0, 0, 1, 2, 3, 4, 5, 6, 7), node("c3", 0, 0, 1, 2, 3, 4, 5, 6, 7)}
	out := PlaceSlice(Request{GPUs: 4}, nodes)
	tiers := map[int][]string{}
	for i, c := range out.Choices {
		if i > 0 && c.Tier < out.Choices[i-1].Tier {
			t.Fatalf("tiers out of order: %v", out.Choices)
		}
		tiers[c.Tier] = append(tiers[c.Tier], short(c))
	}
	// The half-used node fills a node: alone in the best tier. The clean nodes' groups are
	// interchangeable: one tier of six.
	if !reflect.DeepEqual(tiers[0], []string{"half:4,5,6,7"}) || len(tiers[1]) != 6 || len(tiers) != 2 {
		t.Fatalf("tiers %v", tiers)
	}
	rnd := rand.New(rand.NewSource(1))
	firstOfTier1 := map[string]int{}
	for range 300 {
		got := SpreadTies(out.Choices, rnd.Intn)
		if short(got[0]) != "half:4,5,6,7" || len(got) != len(out.Choices) {
			t.Fatalf("spread moved the best choice: %v", shortsOf(got))
		}
		rest := append([]string(nil), shortsOf(got[1:])...)
		want := append([]string(nil), tiers[1]...)
		slices.Sort(rest)
		slices.Sort(want)
		if !slices.Equal(rest, want) {
			t.Fatalf("spread changed tier 1's members: %v", rest)
		}
		firstOfTier1[short(got[1])]++
	}
	if len(firstOfTier1) != 6 {
		t.Fatalf("tier 1 tried first: %v, want each of its 6 choices sometimes", firstOfTier1)
	}
	if short(out.Choices[1]) != tiers[1][0] {
		t.Fatal("SpreadTies modified its input")
	}
	// Without the half-used node the best tier is the clean groups: its first stays first,
	// the other five scatter behind it.
	out = PlaceSlice(Request{GPUs: 4}, []Node{nodes[0], nodes[2], nodes[3]})
	second := map[string]int{}
	for range 300 {
		got := SpreadTies(out.Choices, rnd.Intn)
		if short(got[0]) != short(out.Choices[0]) {
			t.Fatalf("the best choice %s was not tried first: %v", short(out.Choices[0]), shortsOf(got))
		}
		second[short(got[1])]++
	}
	if len(second) != 5 {
		t.Fatalf("tried second: %v, want each of the tier's other 5", second)
	}
}

func shortsOf(cs []Choice) []string {
	var out []string
	for _, c := range cs {
		out = append(out, short(c))
	}
	return out
}

// largestGroup is what nodes.group_available holds for n: the most free slots in one NUMA
// group, a slot of unknown NUMA node counting as a group of its own.
func largestGroup(n Node) int {
	per := map[int]int{}
	best := 0
	for _, s := range n.FreeSlots {
		if s.NUMANode < 0 {
			best = max(best, 1)
			continue
		}
		per[s.NUMANode]++
		best = max(best, per[s.NUMANode])
	}
	return best
}

// A window reads only nodes whose largest free group reaches WindowGroup: no node that could
// settle a request alone (its best choice one group or a whole host) may fall below it, for
// every policy and size, on random topologies with known and unknown NUMA nodes.
func TestWindowGroupNeverHidesASettlingNode(t *testing.T) {
	for gpus, want := range map[int]int{1: 1, 2: 2, 3: 3, 4: 4, 8: 0} {
		if got := WindowGroup(Request{GPUs: gpus}); got != want {
			t.Errorf("WindowGroup(%d GPUs, default policy) = %d, want %d", gpus, got, want)
		}
	}
	rng := rand.New(rand.NewSource(7))
	policies := []Policy{PolicyAny, PolicyNUMAPreferred, PolicyNUMARequired, PolicyFullHost}
	settling := 0
	for i := 0; i < 3000; i++ {
		var free []int
		for s := 0; s < 8; s++ {
			if rng.Intn(2) == 0 {
				free = append(free, s)
			}
		}
		n := node("n", 8-len(free), free...)
		if rng.Intn(4) == 0 {
			n = unknown("u", 8-len(free), free...)
		}
		req := Request{GPUs: 1 + rng.Intn(8), Policy: policies[rng.Intn(len(policies))]}
		out := PlaceSlice(req, []Node{n})
		if !out.Settled() {
			continue
		}
		settling++
		if g := largestGroup(n); g < WindowGroup(req) {
			t.Fatalf("%+v settles %d GPUs (%s) with its largest free group %d < WindowGroup %d: a window would never read it",
				free, req.GPUs, req.Policy, g, WindowGroup(req))
		}
	}
	if settling < 300 {
		t.Fatalf("only %d of 3000 random cases settled: the test checks too little", settling)
	}
}

// Among choices equal on every ranked criterion, the node holding more live allocations comes
// first, ahead of the name; it never outranks a better fit, and it stays a tie-breaker (the
// tier is unchanged, so concurrent creates still spread over it).
func TestMoreAllocationsBreakTies(t *testing.T) {
	withAllocs := func(n Node, k int) Node { n.Allocations = k; return n }
	// Both nodes: one free slot in group 1, the other seven held (by 3 allocations on "a", by
	// 7 on "b"); a 1-GPU request fills either hole alike.
	a := withAllocs(node("a", 7, 7), 3)
	b := withAllocs(node("b", 7, 7), 7)
	out := PlaceSlice(Request{GPUs: 1}, []Node{a, b})
	if got := shorts(out); !slices.Equal(got, []string{"b:7", "a:7"}) {
		t.Fatalf("order %v, want the node with more allocations first", got)
	}
	if out.Choices[0].Tier != out.Choices[1].Tier {
		t.Fatalf("allocations made a tier of their own: %v", out.Choices)
	}
	// Equal allocations: the name decides, as before.
	out = PlaceSlice(Request{GPUs: 1}, []Node{withAllocs(b, 3), a})
	if got := shorts(out); !slices.Equal(got, []string{"a:7", "b:7"}) {
		t.Fatalf("order %v, want name order when allocations are equal", got)
	}
	// A tighter fit beats more allocations.
	loose := withAllocs(node("loose", 5, 5, 6, 7), 5)
	out = PlaceSlice(Request{GPUs: 1}, []Node{loose, a})
	if got := shorts(out)[0]; got != "a:7" {
		t.Fatalf("best %s, want the tighter node a:7 over the one with more allocations", got)
	}
}
