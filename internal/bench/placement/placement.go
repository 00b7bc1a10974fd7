// Package placement is the placement-quality benchmark of `make bench`: a
// churn simulation of slice requests arriving and leaving on a fleet of 8-GPU nodes (two
// NUMA groups of four), comparing gpuaas's scheduler (internal/sched) with first-fit,
// best-fit and random placement on the same request sequence. It measures, per offered load:
// the share of 4- and 8-GPU requests served, fragmentation (the FGD measure: the share of free
// GPUs that cannot host the next request, weighted by the request mix), the same unusable free
// GPUs as a share of the fleet, NUMA-local placement and the allocation ratio at the first
// rejection; and, separately, the allocation ratio at the first rejection when filling an empty
// fleet without departures.
package placement

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/sched"
)

const slotsPerNode, groupSize = 8, 4

// Share is one request size of a demand mix and its share of requests (by count).
type Share struct {
	GPUs int
	P    float64
}

// Mix is the default request-size distribution (by count): sched.DefaultMix's.
var Mix = []Share{{1, 0.4}, {2, 0.3}, {4, 0.2}, {8, 0.1}}

func meanSize(mix []Share) float64 {
	m := 0.0
	for _, x := range mix {
		m += float64(x.GPUs) * x.P
	}
	return m
}

// Cluster is the fleet: used[node][slot], and the names the scheduler sees (made once, so a
// decision does not format thousands of strings).
type Cluster struct {
	used    [][]bool
	allocs  []int            // live requests on each node (nodes.slice_allocations)
	jobs    [][][]int        // each node's live requests, by their slots (sched.Node.Occupants)
	ids     []string         // node id: its index
	names   []string         // node name: n00000, so name order is index order
	slotIDs [][]string       // "node:slot"
	mix     []sched.MixEntry // the demand mix the ranking protects (nil: the default)
}

// NewCluster is n empty nodes.
func NewCluster(n int) *Cluster {
	c := &Cluster{used: make([][]bool, n), allocs: make([]int, n), jobs: make([][][]int, n), ids: make([]string, n), names: make([]string, n), slotIDs: make([][]string, n)}
	for i := range c.used {
		c.used[i] = make([]bool, slotsPerNode)
		c.ids[i] = strconv.Itoa(i)
		c.names[i] = fmt.Sprintf("n%05d", i)
		c.slotIDs[i] = make([]string, slotsPerNode)
		for s := range c.slotIDs[i] {
			c.slotIDs[i][s] = fmt.Sprintf("%d:%d", i, s)
		}
	}
	return c
}

// take marks a placed request's slots in use.
func (c *Cluster) take(n int, slots []int) {
	for _, s := range slots {
		c.used[n][s] = true
	}
	c.allocs[n]++
	c.jobs[n] = append(c.jobs[n], slots)
}

// release frees a departed request's slots.
func (c *Cluster) release(n int, slots []int) {
	for _, s := range slots {
		c.used[n][s] = false
	}
	c.allocs[n]--
	for i, j := range c.jobs[n] {
		if j[0] == slots[0] { // live requests on a node hold disjoint slots
			c.jobs[n] = append(c.jobs[n][:i], c.jobs[n][i+1:]...)
			break
		}
	}
}

func (c *Cluster) freeCount(n int) int {
	k := 0
	for _, u := range c.used[n] {
		if !u {
			k++
		}
	}
	return k
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

// largestGroup is the most free slots in one NUMA group of node n (nodes.group_available).
func (c *Cluster) largestGroup(n int) int {
	best := 0
	for g := 0; g < slotsPerNode; g += groupSize {
		k := 0
		for _, u := range c.used[n][g : g+groupSize] {
			if !u {
				k++
			}
		}
		best = max(best, k)
	}
	return best
}

// fits reports whether size GPUs can be placed on node n under the product's topology policy
// (4 GPUs within one NUMA group, 8 GPUs a whole node, 1-2 anywhere). It counts in place: the
// baselines ask it of every node for every request.
func (c *Cluster) fits(n, size int) bool {
	var perGroup [slotsPerNode / groupSize]int
	for s, u := range c.used[n] {
		if !u {
			perGroup[s/groupSize]++
		}
	}
	free := 0
	for _, k := range perGroup {
		free += k
	}
	switch size {
	case 8:
		return free == slotsPerNode
	case 4:
		for _, k := range perGroup {
			if k >= 4 {
				return true
			}
		}
		return false
	}
	return free >= size
}

// groupFits reports whether some node has size free slots in one NUMA group.
func (c *Cluster) groupFits(size int) bool {
	for _, slots := range c.used {
		for g := 0; g < slotsPerNode; g += groupSize {
			k := 0
			for _, u := range slots[g : g+groupSize] {
				if !u {
					k++
				}
			}
			if k >= size {
				return true
			}
		}
	}
	return false
}

// Placer picks slots for a request, or says it cannot.
type Placer interface {
	Name() string
	Place(c *Cluster, size int, rng *rand.Rand) (node int, slots []int, ok bool)
}

// Ours is gpuaas's scheduler as the controller runs it (internal/alloc): sched.PlaceSlice with
// the SKU's default topology policies and each node's live requests (its look-ahead) over
// best-fit windows of sched.WindowNodes positions (the fewest free slots that can still hold
// the request, then most live requests, then name, from the first node with a NUMA group of
// sched.WindowGroup free slots; only such nodes are ranked, at most sched.WindowTies alike in
// both free slots and live requests, sched.WindowEmptyTies of those holding none), the next window while one's ranking is not settled
// (nothing, or only spans), and every node after sched.WindowsBeforeFullScan windows. With FullScan it ranks every node at once, the fallback
// path alone (what DecisionCost times).
//
// With Learn, its look-ahead protects the demand mix learned from the requests it has seen
// (demand.go), as the controller's does; without, sched.DefaultMix. Churn gives each run a
// learner of its own.
type Ours struct {
	FullScan bool
	Learn    bool
	learner  *learner
}

// Name is "gpuaas".
func (Ours) Name() string { return "gpuaas" }

// Place asks internal/sched, window by window.
func (o Ours) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	c.mix = o.learner.mix()
	order := c.bestFitOrder(size)
	if !o.FullScan {
		var out sched.Outcome
		if c.windows(size, sched.WindowNodes, order, func(win []int) bool {
			out = c.rank(size, win)
			return out.Settled()
		}) {
			return c.first(out)
		}
	}
	return c.first(c.rank(size, order))
}

// bestFitOrder is the nodes with at least size free slots, fewest free first, then most live
// requests, then index (= name): the order of the nodes_best_fit index.
func (c *Cluster) bestFitOrder(size int) []int {
	var by [slotsPerNode + 1][slotsPerNode + 1][]int // free, live requests
	for n := range c.used {
		if f := c.freeCount(n); f >= size {
			by[f][c.allocs[n]] = append(by[f][c.allocs[n]], n)
		}
	}
	order := make([]int, 0, len(c.used))
	for f := size; f <= slotsPerNode; f++ {
		for a := slotsPerNode; a >= 0; a-- {
			order = append(order, by[f][a]...)
		}
	}
	return order
}

// windows walks the controller's best-fit windows over order for a request of size GPUs: each
// spans span positions from the first node (after the last window) whose largest free group
// could hold the request (sched.WindowGroup), and settle gets those of its nodes that could,
// at most sched.WindowTies of each best-fit key (free slots, live requests; sched.WindowEmptyTies
// of a key with no live request), until it reports
// the request settled or sched.WindowsBeforeFullScan windows have been read. It returns
// whether one settled it.
func (c *Cluster) windows(size, span int, order []int, settle func(win []int) bool) bool {
	group := sched.WindowGroup(sched.Request{GPUs: size, Policy: sched.DefaultPolicy(size)})
	next := 0
	for range sched.WindowsBeforeFullScan {
		for next < len(order) && c.largestGroup(order[next]) < group {
			next++
		}
		if next == len(order) {
			return false
		}
		end := min(len(order), next+span)
		var win []int
		tie := 0
		for i, n := range order[next:end] {
			if i > 0 {
				if p := order[next+i-1]; c.freeCount(p) == c.freeCount(n) && c.allocs[p] == c.allocs[n] {
					tie++
				} else {
					tie = 0
				}
			}
			limit := sched.WindowTies
			if c.allocs[n] == 0 && sched.WindowEmptyTies > 0 {
				limit = sched.WindowEmptyTies
			}
			if c.largestGroup(n) >= group && (limit == 0 || tie < limit) {
				win = append(win, n)
			}
		}
		if settle(win) {
			return true
		}
		next = end
	}
	return false
}

// rank runs sched.PlaceSlice over the given nodes.
func (c *Cluster) rank(size int, nodes []int) sched.Outcome {
	in := make([]sched.Node, 0, len(nodes))
	for _, n := range nodes {
		f := c.free(n)
		sn := sched.Node{ID: c.ids[n], Name: c.names[n], GroupSize: map[int]int{0: groupSize, 1: groupSize},
			ApprovedSlots: slotsPerNode, ClaimedSlots: slotsPerNode - len(f), FreeSlots: make([]sched.Slot, len(f)), Allocations: c.allocs[n]}
		for i, s := range f {
			sn.FreeSlots[i] = sched.Slot{ID: c.slotIDs[n][s], SlotIndex: s, NUMANode: s / groupSize}
		}
		for _, j := range c.jobs[n] {
			o := sched.Occupant{NUMANodes: make([]int, len(j))}
			for i, s := range j {
				o.NUMANodes[i] = s / groupSize
			}
			sn.Occupants = append(sn.Occupants, o)
		}
		in = append(in, sn)
	}
	return sched.PlaceSlice(sched.Request{GPUs: size, Policy: sched.DefaultPolicy(size), Mix: c.mix}, in)
}

// first is an outcome's best choice as a node index and slots.
func (c *Cluster) first(out sched.Outcome) (int, []int, bool) {
	if len(out.Choices) == 0 {
		return 0, nil, false
	}
	ch := out.Choices[0]
	n, err := strconv.Atoi(ch.NodeID)
	if err != nil {
		panic("placement: the scheduler returned a node the simulation did not give it: " + ch.NodeID)
	}
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
		if f := c.freeCount(n); f < bestFree && c.fits(n, size) {
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

// Placers are the compared policies, ours first (learning its demand mix, as in production).
func Placers() []Placer { return []Placer{Ours{Learn: true}, firstFit{}, bestFit{}, random{}} }

// Result is one policy at one offered load (one seed, or the mean over seeds).
type Result struct {
	Policy        string  `json:"policy"`
	OfferedLoad   float64 `json:"offered_load"`
	Seed          int64   `json:"seed,omitempty"` // 0 in a mean over seeds
	Served4       float64 `json:"served_4gpu"`
	Served8       float64 `json:"served_8gpu"`
	ServedAll     float64 `json:"served_all"`
	Fragmentation float64 `json:"fragmentation"`
	// Unusable is the same expected unusable free GPUs as Fragmentation, as a share of all the
	// fleet's GPUs instead of its free ones: it does not reward leaving more GPUs free.
	Unusable  float64 `json:"unusable_free_gpus_of_fleet"`
	NUMALocal float64 `json:"numa_local"`
	// NUMALocalFeasible is NUMALocal over the 2- and 4-GPU placements made while some node had
	// one NUMA group with room for them (the target: 100% whenever feasible).
	NUMALocalFeasible float64 `json:"numa_local_when_feasible"`
	Utilization       float64 `json:"utilization"`
	// IdleAtRefusal is the share of the fleet's GPUs that were free when a request was
	// refused, averaged over the refused requests (0 when none was): capacity stranded by
	// fragmentation while demand went unserved.
	IdleAtRefusal float64 `json:"idle_at_refusal"`
	Refused       int     `json:"refused"`
	// FirstRejection is the share of GPUs in use when the first request of the run (from an
	// empty fleet) was refused; 0 when none was.
	FirstRejection float64 `json:"alloc_ratio_at_first_rejection,omitempty"`
}

type event struct {
	size     int
	lifetime float64
	gap      float64
}

// workload is a request sequence for an offered load: arrivals with exponential gaps and
// lifetimes such that demand = load x capacity on average.
func workload(nodes, events int, load float64, seed int64) []event {
	return workloadFor(DefaultDemand, nodes, events, load, seed)
}

// workloadFor is workload under demand d: each request's size is drawn from the mix of its
// phase, and the arrival rate follows the phase's mean size so that the offered load stays
// the same when the mix changes.
func workloadFor(d Demand, nodes, events int, load float64, seed int64) []event {
	rng := rand.New(rand.NewSource(seed))
	capacity := float64(nodes * slotsPerNode)
	meanLife := 100.0
	ev := make([]event, events)
	for i := range ev {
		mix := d.at(i, events)
		rate := load * capacity / (meanSize(mix) * meanLife)
		u := rng.Float64()
		size := mix[len(mix)-1].GPUs
		acc := 0.0
		for _, m := range mix {
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

// departures is the running requests as a min-heap by end time.
type departures []running

func (d departures) Len() int           { return len(d) }
func (d departures) Less(i, j int) bool { return d[i].end < d[j].end }
func (d departures) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)        { *d = append(*d, x.(running)) }
func (d *departures) Pop() any {
	old := *d
	r := old[len(old)-1]
	*d = old[:len(old)-1]
	return r
}

// Churn runs one policy over a workload of the default demand; measurements come from the
// second half (steady state).
func Churn(p Placer, nodes, events int, load float64, seed int64) Result {
	return ChurnDemand(p, DefaultDemand, nodes, events, load, seed)
}

// ChurnDemand is Churn under demand d. A learning policy sees each request (created or
// refused) after its placement, as the controller's creates are counted after their
// transaction; fragmentation is weighed by the generator's mix of the moment, which no
// policy is told.
func ChurnDemand(p Placer, d Demand, nodes, events int, load float64, seed int64) Result {
	c := NewCluster(nodes)
	rng := rand.New(rand.NewSource(seed + 1))
	ev := workloadFor(d, nodes, events, load, seed)
	var learn *learner
	if o, ok := p.(Ours); ok && o.Learn {
		learn = newLearner()
		o.learner = learn
		p = o
	}
	var idleSum float64
	refused := 0
	live := &departures{}
	now := 0.0
	var asked, served [9]int
	multi, local, feasible, feasibleLocal := 0, 0, 0, 0
	var fragSum, unusableSum, utilSum, firstRejection float64
	samples := 0
	for i, e := range ev {
		now += e.gap
		// departures: every request that has ended by now (the order does not matter)
		for live.Len() > 0 && (*live)[0].end <= now {
			r := heap.Pop(live).(running)
			c.release(r.node, r.slots)
		}
		measure := i >= events/2
		if measure {
			asked[e.size]++
		}
		localFeasible := measure && e.size > 1 && e.size < 8 && c.groupFits(e.size)
		n, slots, ok := p.Place(c, e.size, rng)
		learn.see(e.size, now)
		if !ok && firstRejection == 0 {
			firstRejection = utilization(c)
		}
		if !ok && measure {
			idleSum += 1 - utilization(c)
			refused++
		}
		if ok {
			c.take(n, slots)
			heap.Push(live, running{end: now + e.lifetime, node: n, slots: slots})
			if measure {
				served[e.size]++
				if e.size > 1 && e.size < 8 {
					multi++
					if singleGroup(slots) {
						local++
					}
					if localFeasible {
						feasible++
						if singleGroup(slots) {
							feasibleLocal++
						}
					}
				}
			}
		}
		if measure && i%50 == 0 {
			unusable, free := unusableFree(c, d.at(i, events))
			if free > 0 {
				fragSum += unusable / float64(free)
			}
			unusableSum += unusable / float64(len(c.used)*slotsPerNode)
			utilSum += utilization(c)
			samples++
		}
	}
	r := Result{Policy: p.Name(), OfferedLoad: load, Seed: seed, Served4: ratio(served[4], asked[4]), Served8: ratio(served[8], asked[8]),
		ServedAll: ratio(served[1]+served[2]+served[4]+served[8], asked[1]+asked[2]+asked[4]+asked[8]), NUMALocal: ratio(local, multi),
		NUMALocalFeasible: ratio(feasibleLocal, feasible),
		FirstRejection:    firstRejection, Refused: refused}
	if refused > 0 {
		r.IdleAtRefusal = idleSum / float64(refused)
	}
	if samples > 0 {
		r.Fragmentation, r.Unusable, r.Utilization = fragSum/float64(samples), unusableSum/float64(samples), utilSum/float64(samples)
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
		used += slotsPerNode - c.freeCount(n)
	}
	return float64(used) / float64(len(c.used)*slotsPerNode)
}

// Fragmentation is the FGD measure: the expected share of free GPUs that cannot serve the
// next request, over the request mix (a free GPU is unusable for size s when its node cannot
// place s).
func Fragmentation(c *Cluster) float64 {
	unusable, free := unusableFree(c, Mix)
	if free == 0 {
		return 0
	}
	return unusable / float64(free)
}

// unusableFree is the expected number of free GPUs that cannot serve the next request, over
// the request mix, and the number of free GPUs.
func unusableFree(c *Cluster, mix []Share) (unusable float64, free int) {
	for n := range c.used {
		f := c.freeCount(n)
		if f == 0 {
			continue
		}
		free += f
		for _, m := range mix {
			if !c.fits(n, m.GPUs) {
				unusable += m.P * float64(f)
			}
		}
	}
	return unusable, free
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
		c.take(n, slots)
	}
	return utilization(c)
}

// Sweep runs every policy at every load with every seed (each seed is its own request
// sequence, the same for every policy), ordered by load, seed, then Placers' order. The runs
// are independent and deterministic, so they run on every CPU at once; the results are the
// same as one by one.
func Sweep(nodes, events int, loads []float64, seeds []int64) []Result {
	return SweepDemand(DefaultDemand, Placers(), nodes, events, loads, seeds)
}

// SweepDemand is Sweep under demand d with the given policies.
func SweepDemand(d Demand, placers []Placer, nodes, events int, loads []float64, seeds []int64) []Result {
	type job struct {
		p    Placer
		load float64
		seed int64
	}
	var jobs []job
	for _, l := range loads {
		for _, seed := range seeds {
			for _, p := range placers {
				jobs = append(jobs, job{p, l, seed})
			}
		}
	}
	out := make([]Result, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = ChurnDemand(jobs[i].p, d, nodes, events, jobs[i].load, jobs[i].seed)
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	sort.SliceStable(out, func(i, j int) bool { return out[i].OfferedLoad < out[j].OfferedLoad })
	return out
}

// Spread is the mean of one policy at one load over seeds, with the fragmentation and the
// unusable share of the fleet of the best and worst seed.
type Spread struct {
	Mean             Result
	FragMin, FragMax float64
	UnusMin, UnusMax float64
	Seeds            int
}

// Means averages Sweep's results per policy and load, in order of first appearance. The
// allocation ratio at the first rejection is averaged over the seeds that had a rejection.
func Means(rs []Result) []Spread {
	var out []Spread
	index := map[[2]any]int{}
	rejected, refusing := map[int]int{}, map[int]int{}
	for _, r := range rs {
		k := [2]any{r.Policy, r.OfferedLoad}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, Spread{Mean: Result{Policy: r.Policy, OfferedLoad: r.OfferedLoad},
				FragMin: math.Inf(1), FragMax: math.Inf(-1), UnusMin: math.Inf(1), UnusMax: math.Inf(-1)})
		}
		s := &out[i]
		s.Seeds++
		m := &s.Mean
		m.Served4 += r.Served4
		m.Served8 += r.Served8
		m.ServedAll += r.ServedAll
		m.Fragmentation += r.Fragmentation
		m.Unusable += r.Unusable
		m.NUMALocal += r.NUMALocal
		m.NUMALocalFeasible += r.NUMALocalFeasible
		m.Utilization += r.Utilization
		m.Refused += r.Refused
		if r.Refused > 0 {
			m.IdleAtRefusal += r.IdleAtRefusal
			refusing[i]++
		}
		if r.FirstRejection > 0 {
			m.FirstRejection += r.FirstRejection
			rejected[i]++
		}
		s.FragMin, s.FragMax = min(s.FragMin, r.Fragmentation), max(s.FragMax, r.Fragmentation)
		s.UnusMin, s.UnusMax = min(s.UnusMin, r.Unusable), max(s.UnusMax, r.Unusable)
	}
	for i := range out {
		m, n := &out[i].Mean, float64(out[i].Seeds)
		m.Served4, m.Served8, m.ServedAll, m.Fragmentation = m.Served4/n, m.Served8/n, m.ServedAll/n, m.Fragmentation/n
		m.Unusable, m.NUMALocal, m.NUMALocalFeasible, m.Utilization = m.Unusable/n, m.NUMALocal/n, m.NUMALocalFeasible/n, m.Utilization/n
		if k := refusing[i]; k > 0 {
			m.IdleAtRefusal /= float64(k)
		}
		if k := rejected[i]; k > 0 {
			m.FirstRejection /= float64(k)
		}
	}
	return out
}

// DecisionCost is scheduler CPU per placement decision on a fleet of n nodes (half of each
// node's slots in use, a 2-GPU request), averaged over reps decisions, with
// every node ranked at once: the controller's fallback path, and the cost that grows with the
// fleet (a window ranks sched.WindowNodes nodes).
func DecisionCost(n, reps int) time.Duration {
	c := NewCluster(n)
	for i := range c.used {
		for s := 0; s < slotsPerNode; s += 2 {
			c.used[i][s] = true // every other slot: both NUMA groups half full
		}
	}
	start := time.Now()
	for i := 0; i < reps; i++ {
		if _, _, ok := (Ours{FullScan: true}).Place(c, 2, nil); !ok {
			return -1
		}
	}
	return time.Since(start) / time.Duration(reps)
}
