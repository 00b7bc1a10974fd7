package placement

import (
	"testing"
)

// TestLearnerFollowsTheGeneratorsMix: fed the simulated requests (never the generator's mix),
// the bench's learner ends a run with the mix it was generated from, and after a change of
// mix it follows: the default's 2- and 4-GPU requests fade out within the run.
func TestLearnerFollowsTheGeneratorsMix(t *testing.T) {
	share := func(l *learner, gpus int) float64 {
		total, w := 0, 0
		for _, e := range l.mix() {
			total += e.Weight
			if e.GPUs == gpus {
				w = e.Weight
			}
		}
		return float64(w) / float64(total)
	}
	feed := func(d Demand) *learner {
		l := newLearner()
		now := 0.0
		for _, e := range workloadFor(d, 1000, 20000, 1.0, 1) {
			now += e.gap
			l.see(e.size, now)
		}
		return l
	}
	ds := map[string]Demand{}
	for _, d := range Demands() {
		ds[d.Name] = d
	}
	l := feed(ds["bimodal-1-8"])
	if s1, s8 := share(l, 1), share(l, 8); s1 < 0.77 || s1 > 0.83 || s8 < 0.17 || s8 > 0.23 || len(l.mix()) != 2 {
		t.Fatalf("bimodal 80/20: learned %v (1 GPU %.3f, 8 GPUs %.3f)", l.mix(), s1, s8)
	}
	l = feed(ds["default-then-bimodal"])
	if s2, s8 := share(l, 2), share(l, 8); s2 > 0.15 || s8 < 0.15 {
		t.Fatalf("after the change to bimodal: learned %v (2 GPUs %.3f, want well below the default's 0.3; 8 GPUs %.3f)", l.mix(), s2, s8)
	}
	if newLearner().mix() != nil {
		t.Fatal("a learner with no history has a mix; want the default (nil)")
	}
}

// TestChangingDemandIsTheDefaultUntilItChanges: before the change, the changing demand's
// requests are the default demand's, request for request, so its 4-GPU requests (all of them
// before the change) are judged on the default demand's own sequence and fleet
// (docs/placement-quality.md, "The changing mix's 4-GPU result").
func TestChangingDemandIsTheDefaultUntilItChanges(t *testing.T) {
	var changing Demand
	for _, d := range Demands() {
		if d.Name == "default-then-bimodal" {
			changing = d
		}
	}
	const events = 2000
	a, b := workloadFor(DefaultDemand, 100, events, 1.3, 7), workloadFor(changing, 100, events, 1.3, 7)
	change := int(changing.Phases[1].From * events)
	for i := range change {
		if a[i] != b[i] {
			t.Fatalf("request %d before the change: %+v, the default demand's %+v", i, b[i], a[i])
		}
	}
	for i := change; i < events; i++ {
		if b[i].size != 1 && b[i].size != 8 {
			t.Fatalf("request %d after the change asks %d GPUs; the bimodal mix has 1 and 8", i, b[i].size)
		}
	}
}
