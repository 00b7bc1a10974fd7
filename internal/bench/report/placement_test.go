package main

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/bench/placement"
)

func TestPlacementTargetsJudgeEachLoadOnBothReadings(t *testing.T) {
	r := func(policy string, load, share, fleet, numa float64) placement.Result {
		return placement.Result{Policy: policy, OfferedLoad: load, Seed: 1, Fragmentation: share, Unusable: fleet, NUMALocalFeasible: numa}
	}
	means := []placement.Result{
		// load 0.5: exactly 25% below first-fit and 10% below best-fit on the share (met); over
		// the fleet 33% below first-fit (met), 4.8% below best-fit (not met)
		r("gpuaas", 0.5, 0.009, 0.0020, 1), r("first-fit", 0.5, 0.012, 0.0030, 0.9), r("best-fit", 0.5, 0.010, 0.0021, 0.95),
		// load 1.1: 20% below first-fit on the share (not met), 64% over the fleet (met); 4.8%
		// and 7.7% below best-fit (not met); one placement in a hundred spanned groups while
		// one group had room (not met)
		r("gpuaas", 1.1, 0.200, 0.0024, 0.99), r("first-fit", 1.1, 0.250, 0.0066, 0.9), r("best-fit", 1.1, 0.210, 0.0026, 0.95),
	}
	out := placementTargets(means, means, []float64{0.5, 1.1}, 8000)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a line per load, a blank line and the tally, got:\n%s", out)
	}
	for _, want := range []string{
		"load 0.5: unusable free GPUs 16.0 of 8000 (first-fit 24.0, best-fit 16.8).",
		"-25.0% vs first-fit [-25% to -25%] met, -10.0% vs best-fit [-10% to -10%] met.",
		"-33.3% vs first-fit [-33% to -33%] met, -4.8% vs best-fit [-5% to -5%] **not met**.",
		"NUMA-local when feasible 100.00%: met.",
	} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("load 0.5 line lacks %q:\n%s", want, lines[0])
		}
	}
	for _, want := range []string{
		"-20.0% vs first-fit [-20% to -20%] **not met**, -4.8% vs best-fit [-5% to -5%] **not met**.",
		"-63.6% vs first-fit [-64% to -64%] met, -7.7% vs best-fit [-8% to -8%] **not met**.",
		"NUMA-local when feasible 99.00%: **not met**.",
	} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("load 1.1 line lacks %q:\n%s", want, lines[1])
		}
	}
	want := "25% below first-fit 1 of 2 on the share, 2 of 2 over the fleet; 10% below best-fit 1 of 2 on the share, 0 of 2 over the fleet; NUMA-local when feasible 1 of 2."
	if !strings.Contains(lines[3], want) {
		t.Errorf("tally: want %q in\n%s", want, lines[3])
	}
}

func TestPlacementTargetsSkipLoadsWithoutEveryPolicy(t *testing.T) {
	means := []placement.Result{{Policy: "gpuaas", OfferedLoad: 0.5, Fragmentation: 0.1}}
	out := placementTargets(means, means, []float64{0.5}, 8000)
	if strings.Contains(out, "load 0.5") || !strings.Contains(out, "0 of 0 on the share") {
		t.Fatalf("a load without the baselines must not be judged:\n%s", out)
	}
}
