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
