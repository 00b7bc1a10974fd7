package placement

import (
	"container/heap"
	"math"
	"math/bits"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gpuaas/gpuaas/internal/sched"
)

// A learned-value exploration (2026-11-25; docs/performance.md, "Learned node values"):
//
//	PLACEMENT_EXPLORE=1 VALUE_BASE=gpuaas go test -run 'TestExploreValue$' -v ./internal/bench/placement/
//
// A node's state is its live requests by size and NUMA group (stateKey: which requests share
// it, not only its free slots). Churn traces of a baseline policy (seeds 101-104, load 1.0;
// never the evaluation seeds) give each state's empirical semi-Markov chain: mean time in it,
// its unusable free GPUs (maskUnusable) and where it goes next. Solving that chain's
// average-cost equation gives each state's relative value h (chain.solve): the node's future
// unusable GPUs from that state on, against the fleet's average. The candidate (vpol) places
// a request where h(after) - h(before) is least, one group before a span: one step of policy
// improvement over the baseline, per node. VALUE_ITERS repeats it (policy iteration: the next
// chain comes from the candidate's own traces). States seen fewer than 20 times take the mean
// h of the states with the same free slots per group. TestExploreValueDump prints the table.
//
// Result: one step over gpuaas lands within the seeds' spread of gpuaas; further steps
// diverge (the per-node values do not see that a request kept off one node lands on another).

const keyEight = 31 * 31 * 5

func sizeIdx(s int) int {
	switch s {
	case 1:
		return 0
	case 2:
		return 1
	}
	return 2
}

// stateKey is a node's state from its live requests' slot masks, the same for both group orders.
func stateKey(jobs []uint8) int {
	var cnt [2][3]int
	span := 0
	for _, j := range jobs {
		s := bits.OnesCount8(j)
		if s == 8 {
			return keyEight
		}
		if j&0x0f != 0 && j&0xf0 != 0 {
			span++
			continue
		}
		g := 0
		if j&0x0f == 0 {
			g = 1
		}
		cnt[g][sizeIdx(s)]++
	}
	enc := func(a, b int) int {
		ga := cnt[a][0] + 5*cnt[a][1] + 15*cnt[a][2]
		gb := cnt[b][0] + 5*cnt[b][1] + 15*cnt[b][2]
		return (ga*31+gb)*5 + span
	}
	return min(enc(0, 1), enc(1, 0))
}

type valueTable struct {
	h    []float64
	seen []int
	fb   [25]float64 // by free slots per group (the fallback for states seen too rarely)
}

func freeKey(m uint8) int {
	a, b := bits.OnesCount8(m&0x0f), bits.OnesCount8(m&0xf0)
	return min(a, b)*5 + max(a, b)
}

type vpol struct {
	name    string
	t       *valueTable
	windows bool
	span    int
	jobs    map[int][]uint8
	unseen  int
}

func (v *vpol) Name() string { return v.name }

func (v *vpol) value(k int, free uint8) float64 {
	if v.t == nil || v.t.seen[k] < 20 {
		v.unseen++
		return v.t.fb[freeKey(free)]
	}
	return v.t.h[k]
}

func (v *vpol) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	order := c.bestFitOrder(size)
	if v.windows {
		span := sched.WindowNodes
		if v.span > 0 {
			span = v.span
		}
		var n int
		var slots []int
		var ok bool
		if c.windows(size, span, order, func(win []int) bool {
			n, slots, ok = v.placeOn(c, size, win)
			if ok && size < slotsPerNode && !singleGroup(slots) {
				v.jobs[n] = v.jobs[n][:len(v.jobs[n])-1]
				return false
			}
			return ok
		}) {
			return n, slots, ok
		}
	}
	return v.placeOn(c, size, order)
}

func (v *vpol) placeOn(c *Cluster, size int, nodes []int) (int, []int, bool) {
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
		live := v.jobs[n][:0]
		for _, j := range v.jobs[n] {
			if j&m == 0 {
				live = append(live, j)
			}
		}
		v.jobs[n] = live
		var base float64
		if v.t != nil {
			base = v.value(stateKey(live), m)
		}
		for _, t := range maskOptions(m, size) {
			score := 0.0
			if v.t != nil {
				score = v.value(stateKey(append(append([]uint8{}, live...), t)), m&^t) - base
			}
			span := 0.0
			if t&0x0f != 0 && t&0xf0 != 0 && size < slotsPerNode {
				span = 1
			}
			k := [3]float64{span, score, float64(bits.OnesCount8(m))}
			if bestNode < 0 || k[0] < bestKey[0] || k[0] == bestKey[0] && (k[1] < bestKey[1]-1e-9 || math.Abs(k[1]-bestKey[1]) <= 1e-9 && k[2] < bestKey[2]) {
				bestNode, bestTake, bestKey = n, t, k
			}
		}
	}
	if bestNode < 0 {
		return 0, nil, false
	}
	v.jobs[bestNode] = append(v.jobs[bestNode], bestTake)
	var slots []int
	for s := range slotsPerNode {
		if bestTake&(1<<s) != 0 {
			slots = append(slots, s)
		}
	}
	return bestNode, slots, true
}

type liveJob struct {
	end  float64
	node int
	mask uint8
}
type liveHeap []liveJob

func (d liveHeap) Len() int           { return len(d) }
func (d liveHeap) Less(i, j int) bool { return d[i].end < d[j].end }
func (d liveHeap) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *liveHeap) Push(x any)        { *d = append(*d, x.(liveJob)) }
func (d *liveHeap) Pop() any {
	old := *d
	r := old[len(old)-1]
	*d = old[:len(old)-1]
	return r
}

type seg struct {
	t    float64
	key  int
	cost float64
}

// train runs p through the churn and adds every node's state changes to trans.
func train(p Placer, nodes, events int, load float64, seed int64, trans *chain) {
	c := NewCluster(nodes)
	rng := rand.New(rand.NewSource(seed + 1))
	ev := workload(nodes, events, load, seed)
	live := &liveHeap{}
	jobs := make([][]uint8, nodes)
	segs := make([][]seg, nodes)
	now := 0.0
	record := func(n int) {
		var m uint8
		for s, u := range c.used[n] {
			if !u {
				m |= 1 << s
			}
		}
		segs[n] = append(segs[n], seg{now, stateKey(jobs[n]), float64(maskUnusable(m))})
	}
	for n := range nodes {
		record(n)
	}
	for _, e := range ev {
		now += e.gap
		for live.Len() > 0 && (*live)[0].end <= now {
			r := heap.Pop(live).(liveJob)
			for s := range slotsPerNode {
				if r.mask&(1<<s) != 0 {
					c.used[r.node][s] = false
				}
			}
			js := jobs[r.node]
			for i, j := range js {
				if j == r.mask {
					jobs[r.node] = append(js[:i:i], js[i+1:]...)
					break
				}
			}
			record(r.node)
		}
		n, slots, ok := p.Place(c, e.size, rng)
		if !ok {
			continue
		}
		var m uint8
		for _, s := range slots {
			c.used[n][s] = true
			m |= 1 << s
		}
		jobs[n] = append(jobs[n], m)
		heap.Push(live, liveJob{now + e.lifetime, n, m})
		record(n)
	}
	end := now
	for n := range nodes {
		ss := segs[n]
		for i := 0; i+1 < len(ss); i++ {
			if ss[i].t >= end/5 { // steady state
				trans.add(ss[i].key, ss[i+1].key, ss[i+1].t-ss[i].t, ss[i].cost)
			}
		}
	}
}

func parseLoads(s string) []float64 {
	var out []float64
	for _, x := range strings.Split(s, ",") {
		f, _ := strconv.ParseFloat(x, 64)
		out = append(out, f)
	}
	return out
}

func TestExploreValue(t *testing.T) {
	if os.Getenv("PLACEMENT_EXPLORE") == "" {
		t.Skip("exploration: set PLACEMENT_EXPLORE=1")
	}
	nodes, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_NODES", "1000"))
	iters, _ := strconv.Atoi(envOr("VALUE_ITERS", "3"))
	trainLoads := parseLoads(envOr("VALUE_TRAIN_LOADS", "1.0"))
	evalLoads := parseLoads(envOr("PLACEMENT_EXPLORE_LOADS", "0.5,0.7,0.9,1.1,1.3"))
	span, _ := strconv.Atoi(envOr("VALUE_SPAN", "0"))
	windows := span > 0
	trainSeeds := []int64{101, 102, 103, 104}
	first, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_FIRST_SEED", "4"))
	nseeds, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_SEEDS", "3"))
	var evalSeeds []int64
	for s := first; s < first+nseeds; s++ {
		evalSeeds = append(evalSeeds, int64(s))
	}
	var table *valueTable
	base := func() Placer { return bestFit{} }
	if envOr("VALUE_BASE", "best-fit") == "gpuaas" {
		base = func() Placer { return Ours{} }
	}
	gen := base
	for it := 0; it < iters; it++ {
		table = learnChain(gen, nodes, trainLoads, trainSeeds)
		tb := table
		gen = func() Placer { return &vpol{name: "v", t: tb, jobs: map[int][]uint8{}} }
		known := 0
		for _, c := range table.seen {
			if c >= 20 {
				known++
			}
		}
		// evaluate
		type row struct{ load, bf, ours, v, vu, bfu, ou, s8v, s8b, utv, utb float64 }
		var rows []row
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 4)
		for _, l := range evalLoads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				var r row
				r.load = l
				for _, s := range evalSeeds {
					b := Churn(bestFit{}, nodes, nodes*20, l, s)
					o := Churn(Ours{}, nodes, nodes*20, l, s)
					v := Churn(&vpol{name: "v", t: tb, jobs: map[int][]uint8{}, windows: windows, span: span}, nodes, nodes*20, l, s)
					r.bf += b.Fragmentation
					r.ours += o.Fragmentation
					r.v += v.Fragmentation
					r.bfu += b.Unusable
					r.ou += o.Unusable
					r.vu += v.Unusable
					r.s8v += v.Served8 / float64(len(evalSeeds))
					r.s8b += b.Served8 / float64(len(evalSeeds))
					r.utv += v.Utilization / float64(len(evalSeeds))
					r.utb += b.Utilization / float64(len(evalSeeds))
				}
				mu.Lock()
				rows = append(rows, r)
				mu.Unlock()
			}()
		}
		wg.Wait()
		sort.Slice(rows, func(i, j int) bool { return rows[i].load < rows[j].load })
		t.Logf("iteration %d: %d known states", it, known)
		for _, r := range rows {
			t.Logf("  load %.1f share vs BF: gpuaas %+6.1f%% value %+6.1f%% | fleet vs BF: gpuaas %+6.1f%% value %+6.1f%% | served8 %.3f/%.3f util %.4f/%.4f",
				r.load, (r.ours-r.bf)/r.bf*100, (r.v-r.bf)/r.bf*100, (r.ou-r.bfu)/r.bfu*100, (r.vu-r.bfu)/r.bfu*100, r.s8v, r.s8b, r.utv, r.utb)
		}
	}
}

func decodeKey(k int) string {
	if k == keyEight {
		return "[8]"
	}
	span := k % 5
	k /= 5
	ga, gb := k/31, k%31
	g := func(x int) string {
		return strconv.Itoa(x%5) + "x1," + strconv.Itoa(x/5%3) + "x2," + strconv.Itoa(x/15) + "x4"
	}
	return "A{" + g(ga) + "} B{" + g(gb) + "} span " + strconv.Itoa(span)
}

func TestExploreValueDump(t *testing.T) {
	if os.Getenv("PLACEMENT_EXPLORE") == "" {
		t.Skip("exploration: set PLACEMENT_EXPLORE=1")
	}
	tb := learnChain(func() Placer { return Ours{} }, 1000, []float64{1.0}, []int64{101, 102})
	type kv struct{ k, n int }
	var all []kv
	for k, n := range tb.seen {
		if n > 0 {
			all = append(all, kv{k, n})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n })
	t.Logf("%d states seen", len(all))
	for _, x := range all[:min(60, len(all))] {
		t.Logf("%-40s n=%7d h=%9.1f", decodeKey(x.k), x.n, tb.h[x.k])
	}
}

// chain is the empirical semi-Markov chain of one node's state under a policy.
type chain struct {
	mu   sync.Mutex
	time map[int]float64
	n    map[int]int
	cost map[int]float64
	next map[int]map[int]int
}

func newChain() *chain {
	return &chain{time: map[int]float64{}, n: map[int]int{}, cost: map[int]float64{}, next: map[int]map[int]int{}}
}

func (c *chain) add(from, to int, dt, cost float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.time[from] += dt
	c.n[from]++
	c.cost[from] = cost
	if c.next[from] == nil {
		c.next[from] = map[int]int{}
	}
	c.next[from][to]++
}

// solve is the relative values of the chain's average-cost equation
// h(s) = (c(s) - g) T(s) + sum P(s, s') h(s'), h(empty) = 0.
func (c *chain) solve() *valueTable {
	g, tt := 0.0, 0.0
	for s, t := range c.time {
		g += c.cost[s] * t
		tt += t
	}
	g /= tt
	h := map[int]float64{}
	for range 20000 {
		nh := map[int]float64{}
		for s, n := range c.n {
			v := (c.cost[s] - g) * c.time[s] / float64(n)
			for to, k := range c.next[s] {
				v += float64(k) / float64(n) * h[to]
			}
			nh[s] = 0.5*h[s] + 0.5*v
		}
		ref := nh[0]
		for s := range nh {
			nh[s] -= ref
		}
		h = nh
	}
	t := &valueTable{h: make([]float64, keyEight+1), seen: make([]int, keyEight+1)}
	for s, v := range h {
		t.h[s] = v
		t.seen[s] = c.n[s]
	}
	return t
}

func learnChain(p func() Placer, nodes int, loads []float64, seeds []int64) *valueTable {
	ch := newChain()
	var wg sync.WaitGroup
	for _, l := range loads {
		for _, s := range seeds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				train(p(), nodes, nodes*40, l, s, ch)
			}()
		}
	}
	wg.Wait()
	t := ch.solve()
	// fallback by free pattern: the mean h over states with it, weighted by visits
	var fs [25]float64
	var fc [25]int
	for k, n := range t.seen {
		if n > 0 {
			fk := freeOfKey(k)
			fs[fk] += t.h[k] * float64(n)
			fc[fk] += n
		}
	}
	for i := range fs {
		if fc[i] > 0 {
			t.fb[i] = fs[i] / float64(fc[i])
		}
	}
	return t
}

func freeOfKey(k int) int {
	if k == keyEight {
		return 0
	}
	span := k % 5
	k /= 5
	used := func(x int) int { return x%5 + 2*(x/5%3) + 4*(x/15) + span }
	a, b := 4-used(k/31), 4-used(k%31)
	return min(a, b)*5 + max(a, b)
}
