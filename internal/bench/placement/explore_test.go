package placement

import (
	"math"
	"math/bits"
	"math/rand"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The placement-policy exploration behind docs/placement-quality.md (not part of make test):
//
//	PLACEMENT_EXPLORE=1 go test -run TestExplore -v ./internal/bench/placement/
//
// runs alternative rankings through the same churn as the report and prints each one's mean and
// spread over seeds. PLACEMENT_EXPLORE_NODES, _SEEDS, _FIRST_SEED, _LOADS and _POLICIES
// override the fleet (1000), the number of seeds (3) and the first (1), the loads (0.9,1.1)
// and the policies; PLACEMENT_EXPLORE_SEARCH=N instead runs a random search of N weightings of
// node features, selected on seeds 1-2 of a 200-node fleet at load 1.1 (the winners must then
// be checked on other seeds).
//
// The candidates work on bit masks (bit s set: slot s free), so a run takes seconds.

// maskUnusable is a node's expected unusable free GPUs over Mix, in percent x slots.
func maskUnusable(m uint8) int { return int(maskUnusableWeighted(m, 1)) }

// maskUnusableWeighted is maskUnusable with the 8-GPU term counted wholeHost times (the
// horizon's weighting, sched.horizonWholeHost).
func maskUnusableWeighted(m uint8, wholeHost float64) float64 {
	f := bits.OnesCount8(m)
	largest := max(bits.OnesCount8(m&0x0f), bits.OnesCount8(m&0xf0))
	u := 0.0
	for _, x := range Mix {
		fits := f >= x.GPUs
		w := math.Round(x.P * 100)
		switch x.GPUs {
		case 8:
			fits = f == 8
			w *= wholeHost
		case 4:
			fits = largest >= 4
		}
		if !fits {
			u += w * float64(f)
		}
	}
	return u
}

// maskOptions are the placements of size on a node: the lowest slots of each NUMA group that
// fits, else (1 and 2 GPUs) a span, most free group first; 8 GPUs only on an empty node.
func maskOptions(m uint8, size int) []uint8 {
	switch f := bits.OnesCount8(m); {
	case f < size:
		return nil
	case size == 8:
		if f == 8 {
			return []uint8{0xff}
		}
		return nil
	}
	var out []uint8
	for _, g := range []uint8{0x0f, 0xf0} {
		if bits.OnesCount8(m&g) >= size {
			out = append(out, lowestBits(m&g, size))
		}
	}
	if len(out) > 0 || size == 4 {
		return out
	}
	a, b := m&0x0f, m&0xf0
	if bits.OnesCount8(b) > bits.OnesCount8(a) {
		a, b = b, a
	}
	return []uint8{a | lowestBits(b, size-bits.OnesCount8(a))}
}

func lowestBits(m uint8, k int) uint8 {
	var t uint8
	for i := 0; i < 8 && k > 0; i++ {
		if m&(1<<i) != 0 {
			t |= 1 << i
			k--
		}
	}
	return t
}

// features of taking t from a node with free mask m: FGD change, node free after, group
// remainder, opens an empty node, breaks the node's last whole group, leaves one free slot,
// fills the node.
func features(m, t uint8, size int) [7]int {
	after := m &^ t
	group := uint8(0x0f)
	if t&0x0f == 0 {
		group = 0xf0
	}
	whole := func(x uint8) bool { return x&0x0f == 0x0f || x&0xf0 == 0xf0 }
	b := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	fa := bits.OnesCount8(after)
	return [7]int{maskUnusable(after) - maskUnusable(m), fa, bits.OnesCount8(m&group) - size, b(m == 0xff),
		b(whole(m) && !whole(after)), b(fa == 1), b(fa == 0)}
}

// weighted ranks by one NUMA group first, then the weighted sum of features, then node
// fullness, then node index.
type weighted struct {
	name string
	w    [7]int
	// lifetimes, when set, is the run's request sequence: the ranking knows when each request
	// will leave (a clairvoyant bound, not a policy) and breaks FGD ties by end-time alignment.
	lifetimes []event
	noise     float64 // hint = lifetime x exp(noise x N(0,1)); 0: exact
	hintRng   *rand.Rand
	i         int
	now       float64
	ends      map[int][]float64
}

func (p *weighted) Name() string { return p.name }

func (p *weighted) Place(c *Cluster, size int, _ *rand.Rand) (int, []int, bool) {
	end := 0.0
	if p.lifetimes != nil {
		e := p.lifetimes[p.i]
		p.i++
		p.now += e.gap
		life := e.lifetime
		if p.noise > 0 {
			life *= math.Exp(p.noise * p.hintRng.NormFloat64())
		}
		end = p.now + life
	}
	bestNode, bestTake, bestKey := -1, uint8(0), [4]int{}
	for n := range c.used {
		var m uint8
		for s, u := range c.used[n] {
			if !u {
				m |= 1 << s
			}
		}
		align := 0
		if p.lifetimes != nil {
			align = p.alignment(n, end)
		}
		for _, t := range maskOptions(m, size) {
			f := features(m, t, size)
			score := 0
			for i := range f {
				score += p.w[i] * f[i]
			}
			span := 0
			if t&0x0f != 0 && t&0xf0 != 0 && size < 8 {
				span = 1
			}
			k := [4]int{span, score, align, bits.OnesCount8(m)}
			if bestNode < 0 || k[0] < bestKey[0] || k[0] == bestKey[0] && (k[1] < bestKey[1] || k[1] == bestKey[1] && (k[2] < bestKey[2] || k[2] == bestKey[2] && k[3] < bestKey[3])) {
				bestNode, bestTake, bestKey = n, t, k
			}
		}
	}
	if bestNode < 0 {
		return 0, nil, false
	}
	if p.lifetimes != nil {
		p.ends[bestNode] = append(p.ends[bestNode], end)
	}
	var slots []int
	for s := 0; s < slotsPerNode; s++ {
		if bestTake&(1<<s) != 0 {
			slots = append(slots, s)
		}
	}
	return bestNode, slots, true
}

// alignment is how far end lies from the last end of the node's live requests (0.1 time units);
// an empty node ranks last.
func (p *weighted) alignment(n int, end float64) int {
	live, last := p.ends[n][:0], 0.0
	for _, x := range p.ends[n] {
		if x > p.now {
			live = append(live, x)
			last = max(last, x)
		}
	}
	p.ends[n] = live
	if len(live) == 0 {
		return math.MaxInt32
	}
	return int(math.Abs(end-last) * 10)
}

// explorePolicies makes the named policies for one run (the oracle needs the run's requests).
func explorePolicy(name string, nodes, events int, load float64, seed int64) Placer {
	switch name {
	case "gpuaas-fleet": // the scheduler ranking every node (the policy measured before windows)
		return fleetWide{}
	case "fgd-bestfit": // FGD plus node best fit and guards: the best of a constrained search
		return &weighted{name: name, w: [7]int{1, 36, 38, 164, 35, 88, -10}}
	case "fgd-oracle": // FGD, ties broken by departure-time alignment: knows every lifetime
		return &weighted{name: name, w: [7]int{1}, lifetimes: workload(nodes, events, load, seed), ends: map[int][]float64{}}
	case "fgd-hint50", "fgd-hint100", "fgd-hint200": // as fgd-oracle with each lifetime known only within e^(sigma x N(0,1)), sigma 0.5, 1, 2
		sigma, _ := strconv.Atoi(strings.TrimPrefix(name, "fgd-hint"))
		return &weighted{name: name, w: [7]int{1}, lifetimes: workload(nodes, events, load, seed), ends: map[int][]float64{}, noise: float64(sigma) / 100, hintRng: rand.New(rand.NewSource(seed + 99))}
	case "keep-groups": // minimizes the share by keeping whole groups free at any cost
		return &weighted{name: name, w: [7]int{1, 2, 13, 1, 191, 299, -80}}
	}
	// hz<P>a<A>[k<K>][w[N]]: expected departures (explore_horizon_test.go), each live request
	// leaving with probability P% within the horizon, A/10 times the FGD change now (A may be
	// a decimal: a3.33 is a third), the whole-host term counted K/10 times at the horizon
	// (default 10: once; sched.horizonWholeHost is 2, k20); w[N]: in windows (of N best-fit
	// positions; default sched.WindowNodes).
	if m := horizonName.FindStringSubmatch(name); m != nil {
		pp, _ := strconv.Atoi(m[1])
		a, _ := strconv.ParseFloat(m[2], 64)
		k := 10.0
		if m[3] != "" {
			k, _ = strconv.ParseFloat(m[3], 64)
		}
		span, _ := strconv.Atoi(m[5])
		return &horizon{name: name, p: float64(pp) / 100, a: a / 10, wholeHost: k / 10, occupants: occupants{windows: m[4] != "", span: span}}
	}
	for _, p := range Placers() {
		if p.Name() == name {
			return p
		}
	}
	return nil
}

var horizonName = regexp.MustCompile(`^hz(\d+)a(\d+(?:\.\d+)?)(?:k(\d+(?:\.\d+)?))?(w(\d*))?$`)

type fleetWide struct{}

func (fleetWide) Name() string { return "gpuaas-fleet" }
func (fleetWide) Place(c *Cluster, size int, rng *rand.Rand) (int, []int, bool) {
	return Ours{FullScan: true}.Place(c, size, rng)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func TestExplore(t *testing.T) {
	if os.Getenv("PLACEMENT_EXPLORE") == "" {
		t.Skip("exploration, not a test: set PLACEMENT_EXPLORE=1")
	}
	if n, _ := strconv.Atoi(os.Getenv("PLACEMENT_EXPLORE_SEARCH")); n > 0 {
		search(t, n)
		return
	}
	nodes, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_NODES", "1000"))
	seeds, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_SEEDS", "3"))
	first, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_FIRST_SEED", "1"))
	policies := strings.Split(envOr("PLACEMENT_EXPLORE_POLICIES", "first-fit,best-fit,gpuaas,gpuaas-fleet,fgd-bestfit,fgd-oracle,keep-groups"), ",")
	events := nodes * 20
	var loads []float64
	for _, l := range strings.Split(envOr("PLACEMENT_EXPLORE_LOADS", "0.9,1.1"), ",") {
		f, err := strconv.ParseFloat(l, 64)
		if err != nil {
			t.Fatalf("load %q: %v", l, err)
		}
		loads = append(loads, f)
	}
	var seedList []int64
	for s := int64(first); s < int64(first+seeds); s++ {
		seedList = append(seedList, s)
	}
	runs := churnEach(nodes, events, loads, seedList, func(l float64, s int64) []Placer {
		var ps []Placer
		for _, name := range policies {
			p := explorePolicy(name, nodes, events, l, s)
			if p == nil {
				t.Fatalf("unknown policy %q", name)
			}
			ps = append(ps, p)
		}
		return ps
	})
	means := map[[2]any]Result{}
	spreads := Means(runs)
	for _, s := range spreads {
		means[[2]any{s.Mean.Policy, s.Mean.OfferedLoad}] = s.Mean
	}
	rel := func(a, b float64) float64 { return (a - b) / b * 100 }
	for _, s := range spreads {
		r := s.Mean
		ff, bf := means[[2]any{"first-fit", r.OfferedLoad}], means[[2]any{"best-fit", r.OfferedLoad}]
		t.Logf("load %.1f %-12s fragmentation %.4f [%.4f-%.4f] (%+5.1f%% vs first-fit, %+5.1f%% vs best-fit) unusable/fleet %.5f (%+5.1f%%, %+5.1f%%) served 4 %.3f 8 %.3f NUMA-local when feasible %.4f util %.4f",
			r.OfferedLoad, r.Policy, r.Fragmentation, s.FragMin, s.FragMax, rel(r.Fragmentation, ff.Fragmentation), rel(r.Fragmentation, bf.Fragmentation),
			r.Unusable, rel(r.Unusable, ff.Unusable), rel(r.Unusable, bf.Unusable), r.Served4, r.Served8, r.NUMALocalFeasible, r.Utilization)
	}
}

// churnEach runs Churn for each placer that mk makes for each load and seed, two at a time
// (each placer once: candidates keep state), and returns the results ordered by load.
func churnEach(nodes, events int, loads []float64, seeds []int64, mk func(load float64, seed int64) []Placer) []Result {
	var mu sync.Mutex
	var runs []Result
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for _, l := range loads {
		for _, s := range seeds {
			for _, p := range mk(l, s) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem <- struct{}{}
					r := Churn(p, nodes, events, l, s)
					<-sem
					mu.Lock()
					runs = append(runs, r)
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].OfferedLoad < runs[j].OfferedLoad })
	return runs
}

// search tries n random weightings on a 200-node fleet at load 1.1 (seeds 1 and 2) and prints
// the ten lowest fragmentation shares among those that keep best-fit's utilization (within 0.1
// point) and 8-GPU service (within 1 point), and the lowest share overall.
func search(t *testing.T, n int) {
	const nodes, load = 200, 1.1
	eval := func(p Placer) (frag, util, s8 float64) {
		for seed := int64(1); seed <= 2; seed++ {
			r := Churn(p, nodes, nodes*20, load, seed)
			frag, util, s8 = frag+r.Fragmentation/2, util+r.Utilization/2, s8+r.Served8/2
		}
		return
	}
	bf, bfUtil, bfS8 := eval(bestFit{})
	type try struct {
		w              [7]int
		frag, util, s8 float64
	}
	var kept []try
	lowest := try{frag: math.Inf(1)}
	rng := rand.New(rand.NewSource(42))
	for range n {
		w := [7]int{1, rng.Intn(81) - 40, rng.Intn(81) - 40, rng.Intn(201), rng.Intn(101) - 50, rng.Intn(201) - 100, rng.Intn(201) - 100}
		f, u, s8 := eval(&weighted{name: "w", w: w})
		x := try{w, f, u, s8}
		if f < lowest.frag {
			lowest = x
		}
		if u >= bfUtil-0.001 && s8 >= bfS8-0.01 {
			kept = append(kept, x)
		}
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].frag < kept[j].frag })
	t.Logf("best-fit: fragmentation %.4f util %.4f served 8 %.3f", bf, bfUtil, bfS8)
	for _, x := range kept[:min(10, len(kept))] {
		t.Logf("%v fragmentation %.4f (%+.1f%% vs best-fit) util %.4f served 8 %.3f", x.w, x.frag, (x.frag-bf)/bf*100, x.util, x.s8)
	}
	t.Logf("lowest share overall: %v fragmentation %.4f (%+.1f%%) util %.4f served 8 %.3f", lowest.w, lowest.frag, (lowest.frag-bf)/bf*100, lowest.util, lowest.s8)
	t.Logf("%d of %d weightings kept best-fit's utilization and 8-GPU service", len(kept), n)
}
