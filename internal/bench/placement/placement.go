// Package placement is the placement-quality benchmark of `make bench` (issue 9, item 4): a
// churn simulation of slice requests arriving and leaving on a fleet of 8-GPU nodes (two
// NUMA groups of four), comparing gpuaas's scheduler (internal/sched) with first-fit,
// best-fit and random placement on the same request sequence. It measures, per offered load:
// the share of 4- and 8-GPU requests served, fragmentation (the FGD measure: the share of free
// GPUs that cannot host the next request, weighted by the request mix), NUMA-local placement,
// and, separately, the allocation ratio at the first rejection when filling an empty fleet.
package placement

import (
	"fmt"
	"math"
	"math/rand"
	"sort"
	"time"

	"github.com/gpuaas/gpuaas/internal/sched"
)

const slotsPerNode, groupSize = 8, 4

// Mix is the request-size distribution (by count).
var Mix = []struct {
	GPUs int
	P    float64
}{{1, 0.4}, {2, 0.3}, {4, 0.2}, {8, 0.1}}

func meanSize() float64 {
	m := 0.0
	for _, x := range Mix {
		m += float64(x.GPUs) * x.P
	}
	return m
}

// Cluster is the fleet: used[node][slot].
type Cluster struct {
	used [][]bool
}

// NewCluster is n empty nodes.
func NewCluster(n int) *Cluster {
	c := &Cluster{used: make([][]bool, n)}
	for i := range c.used {
		c.used[i] = make([]bool, slotsPerNode)
	}
	return c
}

func (c *Cluster) free(n int) []int {
	var f []int
	for s, u := range c.used[n] {
		if !u {
			f = append(f, s)
		}
	}
	return f
}

// fits reports whether size GPUs can be placed on node n under the product's topology policy
// (4 GPUs within one NUMA group, 8 GPUs a whole node, 1-2 anywhere).
func (c *Cluster) fits(n, size int) bool {
	f := c.free(n)
	switch size {
	case 8:
		return len(f) == slotsPerNode
	case 4:
		for g := 0; g < slotsPerNode/groupSize; g++ {
			k := 0
			for _, s := range f {
				if s/groupSize == g {
					k++
				}
			}
			if k >= 4 {
				return true
			}
		}
		return false
	}
	return len(f) >= size
}

// Placer picks slots for a request, or says it cannot.
type Placer interface {
	Name() string
	Place(c *Cluster, size int, rng *rand.Rand) (node int, slots []int, ok bool)
}

// Ours is gpuaas's scheduler (sched.PlaceSlice with the SKU's default topology policies).
type Ours struct{}

// Name is "gpuaas".
func (Ours) Name() string { return "gpuaas" }

// Place asks internal/sched.
func (Ours) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	nodes := make([]sched.Node, 0, len(c.used))
	for n := range c.used {
		f := c.free(n)
		if len(f) < size {
			continue
		}
		sn := sched.Node{ID: fmt.Sprint(n), Name: fmt.Sprintf("n%05d", n), GroupSize: map[int]int{0: groupSize, 1: groupSize},
			ApprovedSlots: slotsPerNode, ClaimedSlots: slotsPerNode - len(f)}
		for _, s := range f {
			sn.FreeSlots = append(sn.FreeSlots, sched.Slot{ID: fmt.Sprintf("%d:%d", n, s), SlotIndex: s, NUMANode: s / groupSize})
		}
		nodes = append(nodes, sn)
	}
	out := sched.PlaceSlice(sched.Request{GPUs: size, Policy: sched.DefaultPolicy(size)}, nodes)
	if len(out.Choices) == 0 {
		return 0, nil, false
	}
	ch := out.Choices[0]
	var n int
	fmt.Sscan(ch.NodeID, &n)
	return n, ch.SlotIndexes, true
}

type firstFit struct{}

func (firstFit) Name() string { return "first-fit" }
func (firstFit) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	for n := range c.used {
		if c.fits(n, size) {
			return n, pick(c, n, size), true
		}
	}
	return 0, nil, false
}

type bestFit struct{}

func (bestFit) Name() string { return "best-fit" }
func (bestFit) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	best, bestFree := -1, math.MaxInt
	for n := range c.used {
		if f := len(c.free(n)); c.fits(n, size) && f < bestFree {
			best, bestFree = n, f
		}
	}
	if best < 0 {
		return 0, nil, false
	}
	return best, pick(c, best, size), true
}

type random struct{}

func (random) Name() string { return "random" }
func (random) Place(c *Cluster, size int, rng *rand.Rand) (int, []int, bool) {
	var ok []int
	for n := range c.used {
		if c.fits(n, size) {
			ok = append(ok, n)
		}
	}
	if len(ok) == 0 {
		return 0, nil, false
	}
	n := ok[rng.Intn(len(ok))]
	return n, pick(c, n, size), true
}

// pick takes the lowest free slots that satisfy the policy: for 4 GPUs, the first NUMA group
// with four free (the baselines are allowed no better knowledge than that).
func pick(c *Cluster, n, size int) []int {
	f := c.free(n)
	if size == 4 {
		for g := 0; g < slotsPerNode/groupSize; g++ {
			var in []int
			for _, s := range f {
				if s/groupSize == g {
					in = append(in, s)
				}
			}
			if len(in) >= 4 {
				return in[:4]
			}
		}
	}
	return f[:size]
}

// Placers are the compared policies, ours first.
func Placers() []Placer { return []Placer{Ours{}, firstFit{}, bestFit{}, random{}} }

// Result is one policy at one offered load.
type Result struct {
	Policy        string  `json:"policy"`
	OfferedLoad   float64 `json:"offered_load"`
	Served4       float64 `json:"served_4gpu"`
	Served8       float64 `json:"served_8gpu"`
	ServedAll     float64 `json:"served_all"`
	Fragmentation float64 `json:"fragmentation"`
	NUMALocal     float64 `json:"numa_local"`
	Utilization   float64 `json:"utilization"`
}

type event struct {
	size     int
	lifetime float64
	gap      float64
}

// workload is a request sequence for an offered load: arrivals with exponential gaps and
// lifetimes such that demand = load x capacity on average.
func workload(nodes, events int, load float64, seed int64) []event {
	rng := rand.New(rand.NewSource(seed))
	capacity := float64(nodes * slotsPerNode)
	meanLife := 100.0
	rate := load * capacity / (meanSize() * meanLife)
	ev := make([]event, events)
	for i := range ev {
		u := rng.Float64()
		size := Mix[len(Mix)-1].GPUs
		acc := 0.0
		for _, m := range Mix {
			acc += m.P
			if u < acc {
				size = m.GPUs
				break
			}
		}
		ev[i] = event{size: size, lifetime: rng.ExpFloat64() * meanLife, gap: rng.ExpFloat64() / rate}
	}
	return ev
}

type running struct {
	end   float64
	node  int
	slots []int
}

// Churn runs one policy over a workload; measurements come from the second half (steady state).
func Churn(p Placer, nodes, events int, load float64, seed int64) Result {
	c := NewCluster(nodes)
	rng := rand.New(rand.NewSource(seed + 1))
	ev := workload(nodes, events, load, seed)
	var live []running
	now := 0.0
	var asked, served [9]int
	multi, local := 0, 0
	var fragSum, utilSum float64
	samples := 0
	for i, e := range ev {
		now += e.gap
		// departures
		kept := live[:0]
		for _, r := range live {
			if r.end <= now {
				for _, s := range r.slots {
					c.used[r.node][s] = false
				}
				continue
			}
			kept = append(kept, r)
		}
		live = kept
		measure := i >= events/2
		if measure {
			asked[e.size]++
		}
		n, slots, ok := p.Place(c, e.size, rng)
		if ok {
			for _, s := range slots {
				c.used[n][s] = true
			}
			live = append(live, running{end: now + e.lifetime, node: n, slots: slots})
			if measure {
				served[e.size]++
				if e.size > 1 && e.size < 8 {
					multi++
					if singleGroup(slots) {
						local++
					}
				}
			}
		}
		if measure && i%50 == 0 {
			fragSum += Fragmentation(c)
			utilSum += utilization(c)
			samples++
		}
	}
	r := Result{Policy: p.Name(), OfferedLoad: load, Served4: ratio(served[4], asked[4]), Served8: ratio(served[8], asked[8]),
		ServedAll: ratio(served[1]+served[2]+served[4]+served[8], asked[1]+asked[2]+asked[4]+asked[8]), NUMALocal: ratio(local, multi)}
	if samples > 0 {
		r.Fragmentation, r.Utilization = fragSum/float64(samples), utilSum/float64(samples)
	}
	return r
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 1
	}
	return float64(a) / float64(b)
}

func singleGroup(slots []int) bool {
	for _, s := range slots {
		if s/groupSize != slots[0]/groupSize {
			return false
		}
	}
	return true
}

func utilization(c *Cluster) float64 {
	used := 0
	for n := range c.used {
		used += slotsPerNode - len(c.free(n))
	}
	return float64(used) / float64(len(c.used)*slotsPerNode)
}

// Fragmentation is the FGD measure: the expected share of free GPUs that cannot serve the
// next request, over the request mix (a free GPU is unusable for size s when its node cannot
// place s).
func Fragmentation(c *Cluster) float64 {
	free := 0
	unusable := 0.0
	for n := range c.used {
		f := len(c.free(n))
		if f == 0 {
			continue
		}
		free += f
		for _, m := range Mix {
			if !c.fits(n, m.GPUs) {
				unusable += m.P * float64(f)
			}
		}
	}
	if free == 0 {
		return 0
	}
	return unusable / float64(free)
}

// FillRatio fills an empty fleet with the workload's requests (no departures) and returns the
// utilization at the first rejection.
func FillRatio(p Placer, nodes int, seed int64) float64 {
	c := NewCluster(nodes)
	rng := rand.New(rand.NewSource(seed + 2))
	for _, e := range workload(nodes, nodes*slotsPerNode*2, 1, seed) {
		n, slots, ok := p.Place(c, e.size, rng)
		if !ok {
			return utilization(c)
		}
		for _, s := range slots {
			c.used[n][s] = true
		}
	}
	return utilization(c)
}

// Sweep runs every policy at every load.
func Sweep(nodes, events int, loads []float64, seed int64) []Result {
	var out []Result
	for _, l := range loads {
		for _, p := range Placers() {
			out = append(out, Churn(p, nodes, events, l, seed))
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].OfferedLoad < out[j].OfferedLoad })
	return out
}

// DecisionCost is scheduler CPU per placement decision on a fleet of n nodes (half of each
// node's slots in use, a 2-GPU request), averaged over reps decisions (issue 9, item 6).
func DecisionCost(n, reps int) time.Duration {
	c := NewCluster(n)
	for i := range c.used {
		for s := 0; s < slotsPerNode; s += 2 {
			c.used[i][s] = true // every other slot: both NUMA groups half full
		}
	}
	start := time.Now()
	for i := 0; i < reps; i++ {
		if _, _, ok := (Ours{}).Place(c, 2, nil); !ok {
			return -1
		}
	}
	return time.Since(start) / time.Duration(reps)
}
