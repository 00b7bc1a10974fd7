package placement

import (
	"container/heap"
	"math"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"testing"
)

// Instruments where gpuaas and best-fit differ, request by request (docs/placement-quality.md,
// "The changing mix's 4-GPU result"; not part of make test):
//
//	PLACEMENT_EXPLORE=1 go test -run 'TestExploreWindows$' -v ./internal/bench/placement/
//	PLACEMENT_EXPLORE=1 go test -run TestExploreWindowsSeed -v ./internal/bench/placement/
//
// The first compares the two per tenth of the measured requests (4- and 8-GPU requests
// served, GPUs served, clean NUMA groups that 1- and 2-GPU requests broke open, the fleet's
// free groups of four) over PLACEMENT_EXPLORE_SEEDS sequences (16) from
// PLACEMENT_EXPLORE_FIRST_SEED (1), at PLACEMENT_EXPLORE_LOADS (one load: 1.3), under
// PLACEMENT_EXPLORE_DEMAND (a name of Demands(), else the default); PLACEMENT_EXPLORE_OURS=fixed
// gives gpuaas sched.DefaultMix instead of the learned mix, PLACEMENT_EXPLORE_VERBOSE=1 prints
// each seed. The second lists, for one seed, the 4-GPU requests of the first tenth of the
// measured half that one policy served and the other refused.

// trace is one run's outcome per request and the fleet's state when it came.
type trace struct {
	size   []int
	served []bool
	// groups4 is the NUMA groups of four wholly free when the request came (measured half
	// only); empty the empty nodes.
	groups4, empty []int
	// broke is whether a 1- or 2-GPU request took slots of a group that was wholly free.
	broke []bool
}

// churnTrace is ChurnDemand recording each request's outcome.
func churnTrace(p Placer, d Demand, nodes, events int, load float64, seed int64) trace {
	c := NewCluster(nodes)
	rng := rand.New(rand.NewSource(seed + 1))
	ev := workloadFor(d, nodes, events, load, seed)
	var learn *learner
	if o, ok := p.(Ours); ok && o.Learn {
		learn = newLearner()
		o.learner = learn
		p = o
	}
	tr := trace{size: make([]int, events), served: make([]bool, events), groups4: make([]int, events), empty: make([]int, events), broke: make([]bool, events)}
	live := &departures{}
	now := 0.0
	for i, e := range ev {
		now += e.gap
		for live.Len() > 0 && (*live)[0].end <= now {
			r := heap.Pop(live).(running)
			c.release(r.node, r.slots)
		}
		tr.size[i] = e.size
		if i >= events/2 {
			for n := range c.used {
				if c.freeCount(n) == slotsPerNode {
					tr.empty[i]++
				}
				for g := 0; g < slotsPerNode; g += groupSize {
					if c.groupFree(n, g) == groupSize {
						tr.groups4[i]++
					}
				}
			}
		}
		n, slots, ok := p.Place(c, e.size, rng)
		learn.see(e.size, now)
		if ok {
			if e.size < groupSize {
				g := slots[0] / groupSize * groupSize
				tr.broke[i] = c.groupFree(n, g) == groupSize
			}
			c.take(n, slots)
			heap.Push(live, running{end: now + e.lifetime, node: n, slots: slots})
			tr.served[i] = true
		}
	}
	return tr
}

// groupFree is the free slots of node n's NUMA group starting at slot g.
func (c *Cluster) groupFree(n, g int) int {
	k := 0
	for _, u := range c.used[n][g : g+groupSize] {
		if !u {
			k++
		}
	}
	return k
}

// servedIn is the requests of size GPUs among requests from..to-1 that were served, and asked.
func (t trace) servedIn(size, from, to int) (served, asked int) {
	for i := from; i < to; i++ {
		if t.size[i] == size {
			asked++
			if t.served[i] {
				served++
			}
		}
	}
	return served, asked
}

// gpusIn is the GPUs served among requests from..to-1, and asked.
func (t trace) gpusIn(from, to int) (served, asked int) {
	for i := from; i < to; i++ {
		asked += t.size[i]
		if t.served[i] {
			served += t.size[i]
		}
	}
	return served, asked
}

// brokeIn is how many 1- and 2-GPU requests among from..to-1 broke a clean group open.
func (t trace) brokeIn(from, to int) (k int) {
	for i := from; i < to; i++ {
		if t.broke[i] {
			k++
		}
	}
	return k
}

func exploreDemand() Demand {
	for _, d := range Demands() {
		if d.Name == os.Getenv("PLACEMENT_EXPLORE_DEMAND") {
			return d
		}
	}
	return DefaultDemand
}

func TestExploreWindows(t *testing.T) {
	if os.Getenv("PLACEMENT_EXPLORE") == "" {
		t.Skip("exploration, not a test: set PLACEMENT_EXPLORE=1")
	}
	nodes, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_NODES", "1000"))
	seeds, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_SEEDS", "16"))
	first, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_FIRST_SEED", "1"))
	load, _ := strconv.ParseFloat(envOr("PLACEMENT_EXPLORE_LOADS", "1.3"), 64)
	events := nodes * 20
	d := exploreDemand()
	ours, bf := make([]trace, seeds), make([]trace, seeds)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for s := range seeds {
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				if k == 0 {
					ours[s] = churnTrace(Ours{Learn: os.Getenv("PLACEMENT_EXPLORE_OURS") != "fixed"}, d, nodes, events, load, int64(s+first))
				} else {
					bf[s] = churnTrace(bestFit{}, d, nodes, events, load, int64(s+first))
				}
			}()
		}
	}
	wg.Wait()
	windows := [][2]int{{events / 2, events}}
	for k := 5; k < 10; k++ {
		windows = append(windows, [2]int{events * k / 10, events * (k + 1) / 10})
	}
	pts := func(a, b, n int) float64 { return float64(a-b) / float64(max(n, 1)) * 100 }
	for _, w := range windows {
		var d4, d8, dGPUs, dBroke, g4o, g4b []float64
		for s := range seeds {
			o, b := ours[s], bf[s]
			so, a := o.servedIn(4, w[0], w[1])
			sb, _ := b.servedIn(4, w[0], w[1])
			s8o, a8 := o.servedIn(8, w[0], w[1])
			s8b, _ := b.servedIn(8, w[0], w[1])
			go_, ga := o.gpusIn(w[0], w[1])
			gb, _ := b.gpusIn(w[0], w[1])
			fo, fb := 0, 0
			for i := w[0]; i < w[1]; i++ {
				fo += o.groups4[i]
				fb += b.groups4[i]
			}
			n := float64(w[1] - w[0])
			d4 = append(d4, pts(so, sb, a))
			d8 = append(d8, pts(s8o, s8b, a8))
			dGPUs = append(dGPUs, pts(go_, gb, ga))
			dBroke = append(dBroke, float64(o.brokeIn(w[0], w[1])-b.brokeIn(w[0], w[1])))
			g4o, g4b = append(g4o, float64(fo)/n), append(g4b, float64(fb)/n)
			if os.Getenv("PLACEMENT_EXPLORE_VERBOSE") != "" {
				t.Logf("requests %v seed %2d: 4-GPU served %d of %d, best-fit %d (%+.2f points); 8-GPU %d of %d, best-fit %d; free groups of four %.1f, best-fit %.1f",
					w, s+first, so, a, sb, pts(so, sb, a), s8o, a8, s8b, float64(fo)/n, float64(fb)/n)
			}
		}
		m4, se4 := meanSE(d4)
		m8, se8 := meanSE(d8)
		mg, seg := meanSE(dGPUs)
		mb, seb := meanSE(dBroke)
		fo, _ := meanSE(g4o)
		fb, _ := meanSE(g4b)
		t.Logf("requests %v, gpuaas - best-fit (SE): 4-GPU served %+.3f points (%.3f); 8-GPU %+.3f (%.3f); GPUs served %+.3f (%.3f); clean groups broken by 1-2 GPU requests %+.1f (%.1f); free groups of four %.2f, best-fit %.2f",
			w, m4, se4, m8, se8, mg, seg, mb, seb, fo, fb)
	}
}

// meanSE is the mean of x and its standard error.
func meanSE(x []float64) (float64, float64) {
	m := 0.0
	for _, v := range x {
		m += v
	}
	m /= float64(len(x))
	ss := 0.0
	for _, v := range x {
		ss += (v - m) * (v - m)
	}
	return m, math.Sqrt(ss / float64(len(x)-1) / float64(len(x)))
}

func TestExploreWindowsSeed(t *testing.T) {
	if os.Getenv("PLACEMENT_EXPLORE") == "" {
		t.Skip("exploration, not a test: set PLACEMENT_EXPLORE=1")
	}
	seed, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_FIRST_SEED", "12"))
	load, _ := strconv.ParseFloat(envOr("PLACEMENT_EXPLORE_LOADS", "1.3"), 64)
	nodes, _ := strconv.Atoi(envOr("PLACEMENT_EXPLORE_NODES", "1000"))
	events := nodes * 20
	d := exploreDemand()
	o := churnTrace(Ours{Learn: true}, d, nodes, events, load, int64(seed))
	b := churnTrace(bestFit{}, d, nodes, events, load, int64(seed))
	from, to := events/2, events*6/10
	noneO, noneB, asked := 0, 0, 0
	for i := from; i < to; i++ {
		if o.size[i] != 4 {
			continue
		}
		asked++
		if o.groups4[i] == 0 {
			noneO++
		}
		if b.groups4[i] == 0 {
			noneB++
		}
		if o.served[i] != b.served[i] {
			t.Logf("request %d (4 GPUs): gpuaas served %v with %d free groups of four (%d empty nodes), best-fit %v with %d (%d)",
				i, o.served[i], o.groups4[i], o.empty[i], b.served[i], b.groups4[i], b.empty[i])
		}
	}
	t.Logf("4-GPU requests %d; arriving to no free group of four: gpuaas %d, best-fit %d", asked, noneO, noneB)
}
