package main

import (
	"slices"
	"strings"
	"testing"
)

// A WORSE verdict is judged again on as many seeds after the judged ones, and its cell shows
// both readings; other verdicts show one.
func TestWorseIsRecheckedOnHeldOutSeeds(t *testing.T) {
	if got := heldOut([]int64{1, 2, 3, 4}); !slices.Equal(got, []int64{5, 6, 7, 8}) {
		t.Fatalf("held-out seeds of 1-4: %v, want 5-8", got)
	}
	if got := heldOut([]int64{13, 14}); !slices.Equal(got, []int64{15, 16}) {
		t.Fatalf("held-out seeds of 13-14: %v, want 15-16", got)
	}
	p := pairing{diff: -0.0064, se: 0.0021, seeds: 16}
	rc := &recheck{Seeds: heldOut(seedRange(1, 16)), Verdict: judge(pairing{diff: 0.0033, se: 0.0020, seeds: 16}, true), Diff: 0.0033, SE: 0.0020}
	if v := judge(p, true); v != "WORSE" {
		t.Fatalf("verdict %s, want WORSE", v)
	}
	got := cell(judge(p, true), p, rc)
	want := "WORSE (-0.0064 ± 0.0042); on held-out seeds 17-32: equal (+0.0033 ± 0.0040)"
	if got != want {
		t.Fatalf("cell %q, want %q", got, want)
	}
	if got := cell("equal", pairing{diff: 0.001, se: 0.001, seeds: 16}, nil); strings.Contains(got, "held-out") {
		t.Fatalf("an equal verdict was rechecked: %q", got)
	}
}
