package main

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/bench/apibench"
)

// The 1-client latency verdict compares the API's pair with the raw script's pair, round by
// round; the create alone against the raw pair is shown beside it and does not decide it.
func TestOneClientLatencyJudgesPairsAndShowsTheCreate(t *testing.T) {
	run := func(kind string, round int, pair, create float64) apibench.Result {
		return apibench.Result{Kind: kind, Nodes: 5000, Clients: 1, Round: round, Pairs: 100, PairsPerSec: 100, PairP50ms: pair, CreateP50ms: create}
	}
	s := &apiSuite{Fleets: []int{5000}, Clients: []int{1}, Rounds: 3, RunSeconds: 5, Results: []apibench.Result{
		run("api", 1, 7, 4.4), run("pgbench", 1, 3.5, 0), // pair 2.00x, create 1.26x
		run("api", 2, 9, 5.0), run("pgbench", 2, 4, 0), // 2.25x, 1.25x
		run("api", 3, 6, 3.6), run("pgbench", 3, 3, 0), // 2.00x, 1.20x
	}}
	md := s.markdown()
	var line string
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "- 5000 nodes, 1 client:") {
			line = l
		}
	}
	for _, want := range []string{"median of 3 rounds 2.00x (rounds 2.00x, 2.25x, 2.00x)", "(target <= 2x): met.",
		"create alone against the raw script's whole pair (reserve and release): median 1.25x (rounds 1.26x, 1.25x, 1.20x); not the verdict."} {
		if !strings.Contains(line, want) {
			t.Errorf("target line %q lacks %q", line, want)
		}
	}
	s.Results[4].PairP50ms = 9.2 // round 3 at 3.07x: the median is 2.25x, not met, whatever the create says
	md = s.markdown()
	if !strings.Contains(md, "median of 3 rounds 2.25x") || !strings.Contains(md, "(target <= 2x): **not met**.") {
		t.Fatalf("after a slow round 3 the verdict should be 2.25x, not met:\n%s", md)
	}
}

// Each round's raw script is judged against the minimal schema's run of the same round, the
// API's CPU per pair against the raw script's, and the API's WAL per pair at 16 and 64
// clients against 12 KiB; every row shows the minimal reference beside the raw script.
func TestMinimalReferenceCPUAndWALTargets(t *testing.T) {
	run := func(kind string, clients, round int, rate, cpu, wal float64) apibench.Result {
		return apibench.Result{Kind: kind, Nodes: 500, Clients: clients, Round: round, Pairs: 100, PairsPerSec: rate,
			CPUPerPairMS: map[string]float64{"postgres": cpu}, WALPerPairKiB: wal}
	}
	s := &apiSuite{Fleets: []int{500}, Clients: []int{16, 64}, Rounds: 2, RunSeconds: 5, WideRounds: 1, WideRunSeconds: 12, Results: []apibench.Result{
		run("api", 16, 1, 100, 6, 20), run("pgbench", 16, 1, 200, 4, 15), run("minimal", 16, 1, 400, 1, 3), // raw 50% of minimal, CPU 1.5x
		run("api", 16, 2, 100, 8, 22), run("pgbench", 16, 2, 300, 4, 15), run("minimal", 16, 2, 400, 1, 3), // 75%, 2.0x
		run("api", 64, 1, 100, 6, 10), run("pgbench", 64, 1, 300, 5, 15), run("minimal", 64, 1, 400, 1, 3), // 75%, 1.2x
	}}
	md := s.markdown()
	for _, want := range []string{
		"- 500 nodes, 16 clients: the raw script on our schema at 62.5% of the minimal schema's rate, median of 2 rounds (rounds 50%, 75%) (target >= 66%): **not met**.",
		"- 500 nodes, 64 clients: the raw script on our schema at 75.0% of the minimal schema's rate, median of 1 rounds (rounds 75%) (target >= 66%): met.",
		"CPU per pair 1.75x the raw script's (median; rounds 1.50x, 2.00x) (target <= 1.6x): **not met**.",
		"CPU per pair 1.20x the raw script's (median; rounds 1.20x) (target <= 1.6x): met.",
		"WAL per pair through the API at 16 and 64 clients, median of 3 runs 20.0 KiB (target <= 12 KiB): **not met**.",
		"| 500 | 16 | 1 | minimal | 400.0 |",
		"| 500 | 16 | 1 | pgbench | - | 4.00 | 0.00 | 4.00 | 4.00x minimal | 15.0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
