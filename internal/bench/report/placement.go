package main

import (
	"fmt"
	"strings"

	"github.com/gpuaas/gpuaas/internal/bench/placement"
)

// Placement targets, against the baselines at the same offered load.
const (
	targetVsFirstFit = -0.25 // at least 25% fewer unusable free GPUs than first-fit
	targetVsBestFit  = -0.10 // at least 10% fewer than best-fit
)

// placementTargets is the placement section's verdicts: per load, gpuaas's unusable free GPUs
// against first-fit's and best-fit's on both readings of "fewer unusable free GPUs" (the share
// of the free GPUs, and the count over the fleet, shown in GPUs of a fleet of fleetGPUs), and
// NUMA-local placement whenever feasible; then how many loads meet each. runs are the per-seed
// results (for the per-seed ranges), means their means per policy and load.
func placementTargets(runs, means []placement.Result, loads []float64, fleetGPUs int) string {
	var b strings.Builder
	type tally struct{ met, of int }
	var ffShare, ffCount, bfShare, bfCount, numa tally
	count := func(t *tally, ok bool) string {
		t.of++
		if ok {
			t.met++
		}
		return verdict(ok)
	}
	gpus := func(r placement.Result) float64 { return r.Unusable * float64(fleetGPUs) }
	for _, l := range loads {
		ours, ff, bf := find(means, "gpuaas", l), find(means, "first-fit", l), find(means, "best-fit", l)
		if ours.Policy == "" || ff.Policy == "" || bf.Policy == "" {
			continue
		}
		fmt.Fprintf(&b, "- load %.1f: unusable free GPUs %.1f of %d (first-fit %.1f, best-fit %.1f).", l, gpus(ours), fleetGPUs, gpus(ff), gpus(bf))
		fmt.Fprintf(&b, " Share of the free GPUs %.3f: %s vs first-fit %s %s, %s vs best-fit %s %s.",
			ours.Fragmentation, rel1(ours.Fragmentation, ff.Fragmentation), relRange(runs, "first-fit", l, frag),
			count(&ffShare, meets(ours.Fragmentation, ff.Fragmentation, targetVsFirstFit)),
			rel1(ours.Fragmentation, bf.Fragmentation), relRange(runs, "best-fit", l, frag),
			count(&bfShare, meets(ours.Fragmentation, bf.Fragmentation, targetVsBestFit)))
		fmt.Fprintf(&b, " Over the fleet %.4f: %s vs first-fit %s %s, %s vs best-fit %s %s.",
			ours.Unusable, rel1(ours.Unusable, ff.Unusable), relRange(runs, "first-fit", l, unusable),
			count(&ffCount, meets(ours.Unusable, ff.Unusable, targetVsFirstFit)),
			rel1(ours.Unusable, bf.Unusable), relRange(runs, "best-fit", l, unusable),
			count(&bfCount, meets(ours.Unusable, bf.Unusable, targetVsBestFit)))
		fmt.Fprintf(&b, " NUMA-local when feasible %.2f%%: %s.\n", ours.NUMALocalFeasible*100, count(&numa, ours.NUMALocalFeasible >= 1))
	}
	fmt.Fprintf(&b, "\n**Loads meeting each target**: 25%% below first-fit %d of %d on the share, %d of %d over the fleet; 10%% below best-fit %d of %d on the share, %d of %d over the fleet; NUMA-local when feasible %d of %d.\n",
		ffShare.met, ffShare.of, ffCount.met, ffCount.of, bfShare.met, bfShare.of, bfCount.met, bfCount.of, numa.met, numa.of)
	return b.String()
}

// meets reports whether ours is at least -target below base (target is negative: -0.10 is
// 10% fewer). A base of 0 cannot be beaten by a share: met only by 0.
func meets(ours, base, target float64) bool {
	if base <= 0 {
		return ours <= 0
	}
	return (ours-base)/base <= target+1e-12
}

// rel1 is a's difference from b in percent with one decimal (a verdict at 10% must not read
// "-10%" when it is -9.6%).
func rel1(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f%%", (a-b)/b*100)
}
