package placement

import (
	"time"

	"github.com/gpuaas/gpuaas/internal/demand"
	"github.com/gpuaas/gpuaas/internal/sched"
)

// Demand is what the simulated tenants ask for: a request-size mix per phase of the run.
// No policy is told it: gpuaas learns it from the requests it sees, as the controller does.
type Demand struct {
	Name   string
	Phases []Phase
}

// Phase is a mix that holds from a share of the run's requests on.
type Phase struct {
	From float64 // share of the run's requests before the phase begins (the first: 0)
	Mix  []Share
}

// at is the mix of request i of events.
func (d Demand) at(i, events int) []Share {
	mix := d.Phases[0].Mix
	for _, p := range d.Phases[1:] {
		if float64(i) >= p.From*float64(events) {
			mix = p.Mix
		}
	}
	return mix
}

// DefaultDemand is sched.DefaultMix's demand for the whole run.
var DefaultDemand = Demand{Name: "default", Phases: []Phase{{Mix: Mix}}}

// Demands are the demand mixes unlike the default the placement suite judges gpuaas under:
// skewed to small requests, skewed to large ones, bimodal single GPUs and whole hosts (a
// development and training fleet), mixes without some sizes, and a mix that changes during
// the run (from the default to the bimodal one at 60% of the requests, inside the measured
// second half, so the measure includes the time the learner takes to follow).
func Demands() []Demand {
	small := []Share{{1, 0.7}, {2, 0.2}, {4, 0.07}, {8, 0.03}}
	large := []Share{{1, 0.1}, {2, 0.15}, {4, 0.35}, {8, 0.4}}
	bimodal := []Share{{1, 0.8}, {8, 0.2}}
	return []Demand{
		{Name: "small", Phases: []Phase{{Mix: small}}},
		{Name: "large", Phases: []Phase{{Mix: large}}},
		{Name: "bimodal-1-8", Phases: []Phase{{Mix: bimodal}}},
		{Name: "no-8", Phases: []Phase{{Mix: []Share{{1, 0.5}, {2, 0.3}, {4, 0.2}}}}},
		{Name: "2-and-4", Phases: []Phase{{Mix: []Share{{2, 0.5}, {4, 0.5}}}}},
		{Name: "default-then-bimodal", Phases: []Phase{{Mix: Mix}, {From: 0.6, Mix: bimodal}}},
	}
}

// simUnit is one unit of the simulation's time as the learner takes it: lifetimes average
// 100 units, so about 1.7 hours, and demand.HalfLife is 360 units (a run of 20,000 requests
// on 1,000 nodes spans 600-700).
const simUnit = time.Minute

// refreshUnits is how often, in simulated time, the learner's mix is read again: the
// controller's demand.RefreshEvery (requests are counted at once here, where the controller
// flushes them every demand.FlushEvery: 5 of its 15 seconds).
var refreshUnits = float64(demand.RefreshEvery) / float64(simUnit)

var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// learner is the controller's demand learner without its database: demand.Counts with the
// same half-life, and demand.MixOf with the same threshold, over one simulated SKU.
type learner struct {
	counts    *demand.Counts
	now       float64
	refreshed float64
	current   []sched.MixEntry
}

func newLearner() *learner {
	return &learner{counts: demand.NewCounts(demand.HalfLife), refreshed: -refreshUnits}
}

// see counts a request of size GPUs at simulated time at.
func (l *learner) see(size int, at float64) {
	if l == nil {
		return
	}
	l.counts.Add(demand.Key{SKU: "sim", GPUs: size}, 1, simEpoch.Add(time.Duration(at*float64(simUnit))))
	l.now = at
}

// mix is the learned mix as last read (nil: the default, until MinRequests were seen).
func (l *learner) mix() []sched.MixEntry {
	if l == nil {
		return nil
	}
	if l.now-l.refreshed >= refreshUnits {
		l.refreshed = l.now
		l.current, _, _, _ = demand.MixOf(l.counts.Snapshot(simEpoch.Add(time.Duration(l.now*float64(simUnit)))), "sim", "", demand.MinRequests)
	}
	return l.current
}
