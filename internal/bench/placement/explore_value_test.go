package placement

import (
	"container/heap"
	"math/bits"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// A learned-value exploration (docs/performance.md, "Learned node values"):
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
	occupants
	name string
	t    *valueTable
}

func (v *vpol) Name() string { return v.name }

func (v *vpol) value(k int, free uint8) float64 {
	if v.t.seen[k] < 20 {
		return v.t.fb[freeKey(free)]
	}
	return v.t.h[k]
}

func (v *vpol) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	return v.occupants.place(c, size, func(m uint8, live []uint8) func(t uint8) float64 {
		base := v.value(stateKey(live), m)
		return func(t uint8) float64 {
			return v.value(stateKey(append(append([]uint8{}, live...), t)), m&^t) - base
		}
	})
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
	live := &departures{}
	jobs := make([][]uint8, nodes)
	segs := make([][]seg, nodes)
	now := 0.0
	record := func(n int) {
		segs[n] = append(segs[n], seg{now, stateKey(jobs[n]), float64(maskUnusable(freeMask(c, n)))})
	}
	for n := range nodes {
		record(n)
	}
	for _, e := range ev {
		now += e.gap
		for live.Len() > 0 && (*live)[0].end <= now {
			r := heap.Pop(live).(running)
			var mask uint8
			for _, s := range r.slots {
				mask |= 1 << s
			}
			c.release(r.node, r.slots)
			js := jobs[r.node]
			for i, j := range js {
				if j == mask {
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
			m |= 1 << s
		}
		c.take(n, slots)
		jobs[n] = append(jobs[n], m)
		heap.Push(live, running{end: now + e.lifetime, node: n, slots: slots})
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
		gen = func() Placer { return &vpol{name: "v", t: tb} }
		known := 0
		for _, c := range table.seen {
			if c >= 20 {
				known++
			}
		}
		// evaluate: best-fit, production and the candidate on the same sequences
		runs := churnEach(nodes, nodes*20, evalLoads, evalSeeds, func(float64, int64) []Placer {
			return []Placer{bestFit{}, Ours{}, &vpol{name: "value", t: tb, occupants: occupants{windows: windows, span: span}}}
		})
		means := map[[2]any]Result{}
		for _, sp := range Means(runs) {
			means[[2]any{sp.Mean.Policy, sp.Mean.OfferedLoad}] = sp.Mean
		}
		rel := func(a, b float64) float64 { return (a - b) / b * 100 }
		t.Logf("iteration %d: %d states seen 20 times or more", it, known)
		for _, l := range evalLoads {
			bf, o, v := means[[2]any{"best-fit", l}], means[[2]any{"gpuaas", l}], means[[2]any{"value", l}]
			t.Logf("  load %.1f share vs best-fit: gpuaas %+6.1f%% value %+6.1f%% | over the fleet: gpuaas %+6.1f%% value %+6.1f%% | served 8 %.3f (best-fit %.3f) util %.4f (%.4f)",
				l, rel(o.Fragmentation, bf.Fragmentation), rel(v.Fragmentation, bf.Fragmentation), rel(o.Unusable, bf.Unusable), rel(v.Unusable, bf.Unusable),
				v.Served8, bf.Served8, v.Utilization, bf.Utilization)
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
