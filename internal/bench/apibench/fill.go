package apibench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/bench/placement"
)

// FillResult is the state Fill left the fleet in and what it took.
type FillResult struct {
	Target    float64     `json:"target"`    // share of GPUs held
	Ops       int         `json:"ops"`       // creates and releases sent
	Creates   int         `json:"creates"`   //
	Releases  int         `json:"releases"`  //
	Refused   int         `json:"refused"`   // creates refused for capacity
	HeldGPUs  int         `json:"held_gpus"` // allocated when Fill ended
	TotalGPUs int         `json:"total_gpus"`
	Live      int         `json:"live"`    // allocations held
	Seconds   float64     `json:"seconds"` //
	ByFree    map[int]int `json:"nodes_by_available_slots"`
	// GroupOf4 counts nodes with a free NUMA group of four (a 4-GPU request's room).
	GroupOf4 int `json:"nodes_with_free_group_of_4"`
}

// Fill brings a fleet of nodes x 8 GPUs to target (a share of its GPUs) through the API, with
// departures: 16 workers, each creating an allocation of a size drawn from the placement benchmark's mix (placement.Mix) while the fleet
// holds less than target, else releasing a random held one, for ops requests in all. Past
// the target the fleet churns at it, so free GPUs are holes scattered over partly used nodes,
// as a production fleet's are, not the empty nodes a fill without departures leaves. The
// allocations stay (requested: no host takes them in the bench) for the runs that follow.
func Fill(ctx context.Context, env *benchenv.Env, nodes int, target float64, ops int) (FillResult, error) {
	res := FillResult{Target: target, TotalGPUs: nodes * 8, ByFree: map[int]int{}}
	type held struct {
		id   string
		gpus int
	}
	var (
		mu    sync.Mutex
		live  []held
		sent  int
		first error
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	start := time.Now()
	// Placement only takes nodes that heartbeat recently; the fill outlasts the window.
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	go func() {
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-time.After(15 * time.Second):
				if err := env.Heartbeat(hbCtx); err != nil && hbCtx.Err() == nil {
					fail(fmt.Errorf("heartbeat: %w", err))
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		c, err := env.Client()
		if err != nil {
			return res, err
		}
		rng := rand.New(rand.NewPCG(uint64(w), 9))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if sent >= ops || first != nil || ctx.Err() != nil {
					mu.Unlock()
					return
				}
				sent++
				var h held
				release := float64(res.HeldGPUs) >= target*float64(res.TotalGPUs) && len(live) > 0
				if release {
					i := rng.IntN(len(live))
					h = live[i]
					live[i] = live[len(live)-1]
					live = live[:len(live)-1]
					res.HeldGPUs -= h.gpus
					res.Releases++
				}
				mu.Unlock()
				if release {
					if _, err := c.ReleaseAllocation(ctx, h.id); err != nil {
						fail(fmt.Errorf("release: %w", err))
						return
					}
					continue
				}
				gpus := drawSize(rng)
				a, err := c.CreateAllocation(ctx, apiv1.AllocationCreate{SKU: benchenv.SliceSKU, GPUs: gpus}, "")
				mu.Lock()
				switch {
				case err == nil:
					live = append(live, held{a.ID, gpus})
					res.HeldGPUs += gpus
					res.Creates++
				case isUnavailable(err):
					res.Refused++
				}
				mu.Unlock()
				if err != nil && !isUnavailable(err) {
					fail(fmt.Errorf("create %d GPUs: %w", gpus, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	stopHB()
	res.Ops, res.Live, res.Seconds = sent, len(live), time.Since(start).Seconds()
	if first != nil {
		return res, first
	}
	rows, err := env.DB.Query(ctx, `SELECT n.available_slots, count(*)::int,
		count(*) FILTER (WHERE EXISTS (SELECT 1 FROM node_resource_slots s WHERE s.node_id = n.id AND s.status = 'available'
		                               GROUP BY s.numa_node HAVING count(*) >= 4))::int
		FROM nodes n GROUP BY 1`)
	if err != nil {
		return res, err
	}
	defer rows.Close()
	for rows.Next() {
		var free, n, g4 int
		if err := rows.Scan(&free, &n, &g4); err != nil {
			return res, err
		}
		res.ByFree[free] = n
		res.GroupOf4 += g4
	}
	return res, rows.Err()
}

func drawSize(rng *rand.Rand) int {
	x := rng.Float64()
	for _, m := range placement.Mix {
		if x < m.P {
			return m.GPUs
		}
		x -= m.P
	}
	return placement.Mix[len(placement.Mix)-1].GPUs
}

func isUnavailable(err error) bool {
	var ae *apiv1.Error
	return errors.As(err, &ae) && ae.Code == apiv1.CodeSKUUnavailable
}

// Settle vacuums, analyzes and checkpoints the database, as Cleanup does after ending a run's
// leftovers, without releasing anything (a busy fleet's allocations stay).
func Settle(ctx context.Context, env *benchenv.Env) error {
	if err := env.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		return err
	}
	return env.Exec(ctx, `CHECKPOINT`)
}
