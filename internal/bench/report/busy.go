package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/apibench"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// busyRun is the API on a busy fleet: the largest fleet again, in its own database, filled to
// 80% of its GPUs through the API with departures (apibench.Fill), measured at 16 clients in
// rounds taking turns with the empty fleet of the main rows. Every other row starts from an
// empty fleet, where the best-fit window finds room on the first nodes it reads; production
// runs mostly full, with holes scattered over partly used nodes, where a window can walk past
// nodes that cannot take the request.
type busyRun struct {
	Fleet      int                 `json:"fleet"`
	Clients    int                 `json:"clients"`
	Rounds     int                 `json:"rounds"`
	RunSeconds float64             `json:"run_seconds"`
	Fill       apibench.FillResult `json:"fill"`
	Results    []apibench.Result   `json:"results"` // Notes: "empty" or "busy"
	// Windows and FleetScans are the controller's placement counters per create (its
	// /metrics) over all rounds, by arm.
	Windows    map[string]float64 `json:"windows_per_create"`
	FleetScans map[string]float64 `json:"fleet_scans_per_create"`
	// DoubleBooked is the double-booking check on the busy fleet after its rounds.
	DoubleBooked int `json:"double_booked_slots"`
}

var busyArms = []string{"empty", "busy"}

// runBusy fills a new fleet of empty's size and measures it against empty, round by round.
func runBusy(ctx context.Context, work, bin string, empty *benchenv.Env, fleet int, quick bool) (*busyRun, error) {
	b := &busyRun{Fleet: fleet, Clients: 16, Rounds: 5, RunSeconds: 5, Windows: map[string]float64{}, FleetScans: map[string]float64{}}
	ops := 4 * fleet // about 12,000 creates to reach 80% of 5,000 nodes, then 8,000 more churning at it (2 of 3 allocations replaced)
	if quick {
		b.Rounds, b.RunSeconds = 2, 2.5
	}
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: filepath.Join(work, "api-busy"), BinDir: bin})
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	fmt.Printf("api: busy fleet: seeding %d nodes x 8 slots...\n", fleet)
	if _, err := env.AddNodes(ctx, fleet); err != nil {
		return nil, err
	}
	if err := apibench.Cleanup(ctx, env); err != nil {
		return nil, err
	}
	if _, err := apibench.API(ctx, env, fleet, 4, 3*time.Second); err != nil {
		return nil, fmt.Errorf("busy fleet warm-up: %w", err)
	}
	if err := env.Heartbeat(ctx); err != nil {
		return nil, err
	}
	if b.Fill, err = apibench.Fill(ctx, env, fleet, 0.8, ops); err != nil {
		return nil, fmt.Errorf("busy fleet fill: %w", err)
	}
	fmt.Printf("api: busy fleet: %d requests in %.0f s: %d of %d GPUs held by %d allocations, %d nodes with a free group of 4\n",
		b.Fill.Ops, b.Fill.Seconds, b.Fill.HeldGPUs, b.Fill.TotalGPUs, b.Fill.Live, b.Fill.GroupOf4)
	envs := map[string]*benchenv.Env{"empty": empty, "busy": env}
	creates := map[string]float64{}
	for round := 0; round < b.Rounds; round++ {
		order := busyArms
		if round%2 == 1 {
			order = []string{busyArms[1], busyArms[0]}
		}
		for _, arm := range order {
			e := envs[arm]
			if err := e.Heartbeat(ctx); err != nil {
				return nil, err
			}
			settle := apibench.Cleanup // the empty fleet: end any leftovers
			if arm == "busy" {
				settle = apibench.Settle // keep the fill's allocations
			}
			if err := settle(ctx, e); err != nil {
				return nil, err
			}
			w0, s0, err := placementCounters(ctx, e)
			if err != nil {
				return nil, err
			}
			r, err := apibench.API(ctx, e, fleet, b.Clients, time.Duration(b.RunSeconds*float64(time.Second)))
			if err != nil {
				return nil, fmt.Errorf("%s fleet: %w", arm, err)
			}
			w1, s1, err := placementCounters(ctx, e)
			if err != nil {
				return nil, err
			}
			b.Windows[arm] += w1 - w0
			b.FleetScans[arm] += s1 - s0
			creates[arm] += float64(r.Pairs + r.Unplaced)
			r.Round, r.Notes = round+1, arm
			fmt.Printf("api: busy fleet round %d: %-5s %.1f pairs/s (%d nodes, %d clients)\n", round+1, arm, r.PairsPerSec, fleet, b.Clients)
			b.Results = append(b.Results, r)
		}
	}
	for _, arm := range busyArms {
		b.Windows[arm] = ratio(b.Windows[arm], creates[arm])
		b.FleetScans[arm] = ratio(b.FleetScans[arm], creates[arm])
	}
	if b.DoubleBooked, err = apibench.DoubleBooked(ctx, env); err != nil {
		return nil, err
	}
	return b, nil
}

// placementCounters reads the controller's placement counters (alloc.PlacementStats).
func placementCounters(ctx context.Context, env *benchenv.Env) (windows, fleetScans float64, err error) {
	if windows, err = env.Metric(ctx, "gpuaas_placement_windows_total"); err != nil {
		return 0, 0, err
	}
	fleetScans, err = env.Metric(ctx, "gpuaas_placement_fleet_scans_total")
	return windows, fleetScans, err
}

// ratios is busy's rate over empty's, round by round.
func (b *busyRun) ratios() []float64 {
	var out []float64
	for round := 1; round <= b.Rounds; round++ {
		var e, y apibench.Result
		for _, r := range b.Results {
			if r.Round == round && r.Notes == "empty" {
				e = r
			} else if r.Round == round && r.Notes == "busy" {
				y = r
			}
		}
		if e.Pairs > 0 && y.Pairs > 0 {
			out = append(out, ratio(y.PairsPerSec, e.PairsPerSec))
		}
	}
	return out
}

// markdown is the busy fleet's lines for the API section: the fill, each round, and the target.
func (b *busyRun) markdown(w *strings.Builder) {
	f := b.Fill
	free := make([]int, 0, len(f.ByFree))
	for k := range f.ByFree {
		free = append(free, k)
	}
	slices.Sort(free)
	var dist []string
	for _, k := range free {
		dist = append(dist, fmt.Sprintf("%d: %d", k, f.ByFree[k]))
	}
	fmt.Fprintf(w, "\n**A busy fleet.** Every row above starts from an empty fleet. Here a second %d-node fleet (its own database and controller) is first filled through the API to %.0f%% of its GPUs with departures: 16 clients, sizes 1/2/4/8 GPUs in the placement mix, each request a create while the fleet holds less than the target and otherwise the release of a random held allocation, %d requests in all (%d creates, %d releases, %d refused; %.0f s). It ends holding %d of %d GPUs in %d allocations; nodes by available slots: %s; %d nodes have a free NUMA group of 4 (a 4-GPU request's room). Then the 4-GPU create+release loop runs on it and on the empty %d-node fleet above in %d rounds of %g s, taking turns. Windows and fleet scans are the controller's placement counters (`gpuaas_placement_windows_total`, `gpuaas_placement_fleet_scans_total`) per create.\n\n",
		b.Fleet, f.Target*100, f.Ops, f.Creates, f.Releases, f.Refused, f.Seconds, f.HeldGPUs, f.TotalGPUs, f.Live, strings.Join(dist, ", "), f.GroupOf4, b.Fleet, b.Rounds, b.RunSeconds)
	w.WriteString("| round | fleet | pairs/s | pair p50 ms | pair p99 ms | controller | postgres | load generator | total CPU ms/pair | WAL KiB | unplaced | errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range b.Results {
		c := r.CPUPerPairMS
		fmt.Fprintf(w, "| %d | %s | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %d | %d |\n", r.Round, r.Notes, r.PairsPerSec, r.PairP50ms, r.PairP99ms,
			c["controller"], c["postgres"], c["client"], totalCPU(r), r.WALPerPairKiB, r.Unplaced, errorCount(r))
	}
	fmt.Fprintf(w, "\nPlacement per create: empty %.2f windows, %.3f fleet scans; busy %.2f windows, %.3f fleet scans.\n",
		b.Windows["empty"], b.FleetScans["empty"], b.Windows["busy"], b.FleetScans["busy"])
}

// target is the busy fleet's line in the targets list.
func (b *busyRun) target(w *strings.Builder) {
	qs := b.ratios()
	q := benchenv.Median(qs)
	fmt.Fprintf(w, "- busy fleet (added by this harness; the issue's targets all run on empty fleets): %d nodes at %.0f%% of their GPUs, %d clients: %.0f%% of the empty fleet's rate, median of %d rounds (rounds %s) (target >= 80%%, as for fleet size: a decision's cost must not grow with the fleet's state either): %s.\n",
		b.Fleet, b.Fill.Target*100, b.Clients, q*100, len(qs), percentList(qs), verdict(q >= 0.8))
}

func errorCount(r apibench.Result) int {
	n := 0
	for _, v := range r.Errors {
		n += v
	}
	return n
}
