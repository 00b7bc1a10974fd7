package main

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/bench/apibench"
)

func TestWakeOrderPutsEachReplicaInEachPlaceEqually(t *testing.T) {
	places := map[string][]int{}
	after := map[[2]string]int{}
	for round := 0; round < 6; round++ {
		order := wakeOrder(round)
		if len(order) != len(wakeArms) {
			t.Fatalf("round %d: %d replicas, want %d", round, len(order), len(wakeArms))
		}
		for i, a := range order {
			if places[a.name] == nil {
				places[a.name] = make([]int, len(wakeArms))
			}
			places[a.name][i]++
			if i > 0 {
				after[[2]string{order[i-1].name, a.name}]++
			}
		}
	}
	for name, p := range places {
		for i, n := range p {
			if n != 2 {
				t.Errorf("%s ran in place %d %d times in 6 rounds, want 2 (%v)", name, i+1, n, p)
			}
		}
	}
	for _, x := range wakeArms {
		for _, y := range wakeArms {
			if x != y && after[[2]string{x.name, y.name}] == 0 {
				t.Errorf("%s never ran right after %s", y.name, x.name)
			}
		}
	}
}

// wakeSuite is a wake-up measure whose rounds ran at the given rates and load-generator CPU
// per pair, per replica in wakeArms order.
func wakeSuite(rates, gen [][3]float64) *apiSuite {
	s := &apiSuite{}
	for round := range rates {
		for i, a := range wakeArms {
			s.Wakeup = append(s.Wakeup, apibench.Result{Kind: "api", Nodes: 5000, Clients: 16, Round: round + 1, Notes: a.name,
				PairsPerSec: rates[round][i], CPUPerPairMS: map[string]float64{"client": gen[round][i]}})
		}
	}
	return s
}

// wakeLine is the wake-up line of three rounds that each ran at rate and load-generator CPU
// per pair gen, per replica in wakeArms order.
func wakeLine(rate, gen [3]float64) string {
	var b strings.Builder
	wakeSuite([][3]float64{rate, rate, rate}, [][3]float64{gen, gen, gen}).wakeupMarkdown(&b)
	return b.String()
}

func TestWakeupVerdictUsesSpeedAdjustedCostAndControl(t *testing.T) {
	same := [3]float64{0.5, 0.5, 0.5}
	// The machine slows in the "on" runs (every process's CPU per pair up by a quarter, the
	// rate down by a fifth): the raw cost reads 20%, the adjusted cost 0.
	if got := wakeLine([3]float64{240, 300, 300}, [3]float64{0.625, 0.5, 0.5}); !strings.Contains(got, "median cost 20% ") || !strings.Contains(got, "median cost 0.0% ") || !strings.Contains(got, ": met.") {
		t.Errorf("a slower machine in the on runs, not the path: want raw 20%%, adjusted 0.0%%, met; got\n%s", got)
	}
	// A real cost: the same machine speed, 15% fewer pairs with the path on.
	if got := wakeLine([3]float64{255, 300, 300}, same); !strings.Contains(got, "median cost 15.0% ") || !strings.Contains(got, "**not met**") {
		t.Errorf("a 15%% cost at the same speed: want adjusted 15.0%%, not met; got\n%s", got)
	}
	// No cost, but the A/A control reads 8% apart: the rounds cannot resolve the target.
	if got := wakeLine([3]float64{300, 300, 276}, same); !strings.Contains(got, "**not met**") || !strings.Contains(got, "8.0% adjusted") {
		t.Errorf("a control 8%% off: want not met; got\n%s", got)
	}
	// A round missing a replica (a run that failed) is left out, not compared half.
	partial := wakeSuite([][3]float64{{300, 300, 300}}, [][3]float64{{0.5, 0.5, 0.5}})
	partial.Wakeup = append(partial.Wakeup, apibench.Result{Round: 2, Notes: "on", PairsPerSec: 1, CPUPerPairMS: map[string]float64{"client": 1}})
	if n := len(partial.wakeRounds()); n != 1 {
		t.Errorf("rounds with every replica: %d, want 1", n)
	}
}
