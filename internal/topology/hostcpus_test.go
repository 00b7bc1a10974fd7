package topology

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/cpuset"
)

// layout is a generated host: NUMA nodes of cores with 1, 2 or 4 threads, the CPUs numbered
// the way Linux numbers them (first threads of every core across the host, then the second
// threads), a housekeeping set and slots, some keeping a set of their own.
type layout struct {
	numa         []NUMANode
	housekeeping []int
	slots        []SlotCPUs
}

func genLayout(r *rand.Rand) layout {
	nodes, coresPer, threads := 1+r.IntN(4), 1+r.IntN(24), []int{1, 2, 4}[r.IntN(3)]
	total := nodes * coresPer
	var l layout
	var allCores [][]int
	for n := 0; n < nodes; n++ {
		var cpus []int
		nn := NUMANode{Node: n}
		for c := 0; c < coresPer; c++ {
			var sib []int
			for t := 0; t < threads; t++ {
				sib = append(sib, t*total+n*coresPer+c)
			}
			cpus = append(cpus, sib...)
			allCores = append(allCores, sib)
			if r.IntN(10) > 0 { // now and then a core whose siblings sysfs did not report
				nn.Cores = append(nn.Cores, cpuset.Format(sib))
			}
		}
		nn.CPUs = cpuset.Format(cpus)
		l.numa = append(l.numa, nn)
	}
	switch r.IntN(3) {
	case 0:
		l.housekeeping, _ = DefaultHousekeeping(l.numa)
	case 1: // a few random CPUs, possibly half a core
		for i := 0; i < r.IntN(4); i++ {
			l.housekeeping = append(l.housekeeping, r.IntN(total*threads))
		}
	}
	taken := map[int]bool{}
	for _, c := range l.housekeeping {
		taken[c] = true
	}
	idx := 0
	for n := 0; n < nodes; n++ {
		for k := r.IntN(5); k > 0; k-- {
			node := n
			s := SlotCPUs{SlotIndex: idx, NUMANode: &node}
			idx += 1 + r.IntN(3)
			if r.IntN(4) == 0 { // a slot that keeps a free core of its node as its set
				c := allCores[n*coresPer+r.IntN(coresPer)]
				free := true
				for _, x := range c {
					free = free && !taken[x]
				}
				if free {
					for _, x := range c {
						taken[x] = true
					}
					s.HostCPUs = append([]int(nil), c...)
				}
			}
			l.slots = append(l.slots, s)
		}
	}
	r.Shuffle(len(l.slots), func(i, j int) { l.slots[i], l.slots[j] = l.slots[j], l.slots[i] })
	return l
}

// Over generated layouts, the sets AssignHostCPUs makes never share a CPU with each other,
// with a slot that keeps its set, or with the housekeeping set; each lies inside its slot's
// NUMA node; each is made of whole cores (a core's siblings all in the set or none); every
// slot to fill gets one, all of one node's the same number of cores; and it is an error only when a node
// has fewer free cores than slots to fill.
func TestAssignHostCPUsProperties(t *testing.T) {
	for seed := uint64(0); seed < 2000; seed++ {
		r := rand.New(rand.NewPCG(seed, 31))
		l := genLayout(r)
		got, err := AssignHostCPUs(l.numa, l.housekeeping, l.slots, nil)
		desc := fmt.Sprintf("seed %d: numa %+v housekeeping %v slots %+v", seed, l.numa, l.housekeeping, l.slots)
		if err != nil {
			if !shortOfCores(l) {
				t.Fatalf("%s: %v, yet every node has a free core per slot", desc, err)
			}
			continue
		}
		nodeOf, _ := NodeOfCPUs(l.numa)
		owner := map[int]string{}
		for _, c := range l.housekeeping {
			owner[c] = "housekeeping"
		}
		for _, s := range l.slots {
			for _, c := range s.HostCPUs {
				owner[c] = fmt.Sprintf("kept slot %d", s.SlotIndex)
			}
		}
		sizes := map[int]int{}
		for _, s := range l.slots {
			set, filled := got[s.SlotIndex]
			if len(s.HostCPUs) > 0 {
				if filled {
					t.Fatalf("%s: slot %d kept its set yet was given %v", desc, s.SlotIndex, set)
				}
				continue
			}
			if !filled || len(set) == 0 {
				t.Fatalf("%s: slot %d got no CPUs", desc, s.SlotIndex)
			}
			for _, c := range set {
				if o, ok := owner[c]; ok {
					t.Fatalf("%s: CPU %d given to slot %d is %s's", desc, c, s.SlotIndex, o)
				}
				owner[c] = fmt.Sprintf("slot %d", s.SlotIndex)
				if n, ok := nodeOf[c]; !ok || n != *s.NUMANode {
					t.Fatalf("%s: CPU %d of slot %d is not on its NUMA node %d", desc, c, s.SlotIndex, *s.NUMANode)
				}
			}
			ncores := 0
			for _, nn := range l.numa {
				_, cores, _ := nodeCores(nn)
				for _, co := range cores {
					k := len(cpuset.Overlap(co, set))
					if k != 0 && k != len(co) {
						t.Fatalf("%s: slot %d holds %d of core %v's siblings", desc, s.SlotIndex, k, co)
					}
					if k != 0 {
						ncores++
					}
				}
			}
			if prev, ok := sizes[*s.NUMANode]; ok && prev != ncores {
				t.Fatalf("%s: slots of node %d got %d and %d cores", desc, *s.NUMANode, prev, ncores)
			}
			sizes[*s.NUMANode] = ncores
		}
	}
}

// shortOfCores says whether some node has fewer free whole cores than slots to fill.
func shortOfCores(l layout) bool {
	taken := map[int]bool{}
	for _, c := range l.housekeeping {
		taken[c] = true
	}
	want := map[int]int{}
	for _, s := range l.slots {
		for _, c := range s.HostCPUs {
			taken[c] = true
		}
		if len(s.HostCPUs) == 0 {
			want[*s.NUMANode]++
		}
	}
	for _, n := range l.numa {
		_, cores, _ := nodeCores(n)
		free := 0
		for _, co := range cores {
			ok := true
			for _, x := range co {
				ok = ok && !taken[x]
			}
			if ok {
				free++
			}
		}
		if free < want[n.Node] {
			return true
		}
	}
	return false
}

// On the H200 fixture's shape (two nodes of 48 two-thread cores, CPU c's sibling c+96), the
// default keeps core 0 (CPUs 0 and 96) and core 48 (48 and 144) for the host, and the four
// slots of node 0 get 11 cores each, siblings together, in slot order.
func TestAssignHostCPUsH200(t *testing.T) {
	numa := []NUMANode{{Node: 0, CPUs: "0-47,96-143"}, {Node: 1, CPUs: "48-95,144-191"}}
	for c := 0; c < 96; c++ {
		numa[c/48].Cores = append(numa[c/48].Cores, fmt.Sprintf("%d,%d", c, c+96))
	}
	hk, err := DefaultHousekeeping(numa)
	if err != nil || cpuset.Format(hk) != "0,48,96,144" {
		t.Fatalf("default housekeeping = %v, %v; want 0,48,96,144", cpuset.Format(hk), err)
	}
	var slots []SlotCPUs
	for i := 0; i < 8; i++ {
		n := i / 4
		slots = append(slots, SlotCPUs{SlotIndex: i, NUMANode: &n})
	}
	got, err := AssignHostCPUs(numa, hk, slots, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]string{0: "1-11,97-107", 1: "12-22,108-118", 2: "23-33,119-129", 3: "34-44,130-140",
		4: "49-59,145-155", 5: "60-70,156-166", 6: "71-81,167-177", 7: "82-92,178-188"}
	gotText := map[int]string{}
	for k, v := range got {
		gotText[k] = cpuset.Format(v)
	}
	if !reflect.DeepEqual(gotText, want) {
		t.Fatalf("sets = %v\nwant %v", gotText, want)
	}
}

// Slots approved one at a time get the sets they would get approved together: with four GPUs
// expected on NUMA node 0, the first slot takes a quarter of the node's share, not all of it,
// and the next still finds its quarter.
func TestAssignHostCPUsOneAtATime(t *testing.T) {
	numa := []NUMANode{{Node: 0, CPUs: "0-47,96-143"}}
	for c := 0; c < 48; c++ {
		numa[0].Cores = append(numa[0].Cores, fmt.Sprintf("%d,%d", c, c+96))
	}
	hk := []int{0, 96}
	zero := 0
	expected := map[int]int{0: 4}
	first, err := AssignHostCPUs(numa, hk, []SlotCPUs{{SlotIndex: 2, NUMANode: &zero}}, expected)
	if err != nil || cpuset.Format(first[2]) != "1-11,97-107" {
		t.Fatalf("first slot alone = %v, %v; want 1-11,97-107 (a quarter)", cpuset.Format(first[2]), err)
	}
	second, err := AssignHostCPUs(numa, hk, []SlotCPUs{{SlotIndex: 2, NUMANode: &zero, HostCPUs: first[2]}, {SlotIndex: 0, NUMANode: &zero}}, expected)
	if err != nil || cpuset.Format(second[0]) != "12-22,108-118" {
		t.Fatalf("second slot = %v, %v; want 12-22,108-118", cpuset.Format(second[0]), err)
	}
}

// Refusals name what is wrong: a slot with no NUMA node, on an unknown node, or a node with
// too few cores.
func TestAssignHostCPUsRefusals(t *testing.T) {
	numa := []NUMANode{{Node: 0, CPUs: "0-1", Cores: []string{"0-1"}}}
	zero, two := 0, 2
	for _, tc := range []struct {
		slots []SlotCPUs
		want  string
	}{
		{[]SlotCPUs{{SlotIndex: 3}}, "slot 3 has no NUMA node"},
		{[]SlotCPUs{{SlotIndex: 4, NUMANode: &two}}, "slot 4 is on NUMA node 2, which discovery did not find"},
		{[]SlotCPUs{{SlotIndex: 0, NUMANode: &zero}, {SlotIndex: 1, NUMANode: &zero}}, "NUMA node 0 has 1 free cores"},
	} {
		_, err := AssignHostCPUs(numa, nil, tc.slots, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v; want %q", tc.slots, err, tc.want)
		}
	}
}
