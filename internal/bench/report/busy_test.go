package main

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/bench/apibench"
)

// The busy-fleet verdict is the median of each round's busy rate over the empty rate of the
// same round, whichever ran first in it.
func TestBusyVerdictPairsRounds(t *testing.T) {
	run := func(round int, arm string, rate float64) apibench.Result {
		return apibench.Result{Round: round, Notes: arm, Pairs: int(rate * 5), PairsPerSec: rate}
	}
	b := &busyRun{Fleet: 5000, Clients: 16, Rounds: 3, Fill: apibench.FillResult{Target: 0.8, ByFree: map[int]int{0: 10}},
		Results: []apibench.Result{
			run(1, "empty", 300), run(1, "busy", 270), // 90%
			run(2, "busy", 150), run(2, "empty", 200), // 75%
			run(3, "empty", 100), run(3, "busy", 85), // 85%
		}}
	if got := percentList(b.ratios()); got != "90%, 75%, 85%" {
		t.Fatalf("round ratios %s, want 90%%, 75%%, 85%%", got)
	}
	var w strings.Builder
	b.target(&w)
	if !strings.Contains(w.String(), "85% of the empty fleet's rate") || !strings.HasSuffix(strings.TrimSpace(w.String()), ": met.") {
		t.Fatalf("target line %q: want the median 85%%, met", w.String())
	}
	b.Results[5].PairsPerSec = 70 // round 3 at 70%: median 75%
	w.Reset()
	b.target(&w)
	if !strings.Contains(w.String(), "75% of the empty fleet's rate") || !strings.Contains(w.String(), "**not met**") {
		t.Fatalf("target line %q: want the median 75%%, not met", w.String())
	}
}
