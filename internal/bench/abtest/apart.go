package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/apibench"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// runApart compares two builds each on its own database and fleet (see the package comment's
// -apart): every round runs the create+release loop on one, then on the other, the order
// reversed every other round, so drift falls on both alike over the rounds.
func runApart(ctx context.Context, binA, binB string, nodes, clients int, each time.Duration, rounds int, busy bool) error {
	dir, err := os.MkdirTemp("", "abtest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // PostgreSQL runs as its own user under root
		return err
	}
	var envs [2]*benchenv.Env
	for i, bin := range []string{binA, binB} {
		abs, err := filepath.Abs(bin)
		if err != nil {
			return err
		}
		env, err := benchenv.Start(ctx, benchenv.Options{Dir: filepath.Join(dir, string(rune('a'+i))), BinDir: abs})
		if err != nil {
			return err
		}
		defer env.Stop()
		envs[i] = env
		if _, err := env.AddNodes(ctx, nodes); err != nil {
			return err
		}
		if err := apibench.Cleanup(ctx, env); err != nil {
			return err
		}
		if _, err := apibench.API(ctx, env, nodes, 4, 3*time.Second); err != nil { // pools and plan caches
			return err
		}
		if busy {
			if err := env.Heartbeat(ctx); err != nil {
				return err
			}
			f, err := apibench.Fill(ctx, env, nodes, 0.8, 4*nodes)
			if err != nil {
				return fmt.Errorf("build %c: fill: %w", 'A'+i, err)
			}
			fmt.Printf("build %c: fleet filled: %d of %d GPUs held by %d allocations\n", 'A'+i, f.HeldGPUs, f.TotalGPUs, f.Live)
		}
	}
	// A busy fleet keeps its allocations between runs (Settle); an empty one ends leftovers.
	settle := apibench.Cleanup
	if busy {
		settle = apibench.Settle
	}
	var rate, cpu []float64
	for r := 0; r < rounds; r++ {
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		var res [2]apibench.Result
		for _, i := range order {
			if err := envs[i].Heartbeat(ctx); err != nil {
				return err
			}
			if err := settle(ctx, envs[i]); err != nil {
				return err
			}
			if res[i], err = apibench.API(ctx, envs[i], nodes, clients, each); err != nil {
				return fmt.Errorf("build %c: %w", 'A'+i, err)
			}
			if res[i].Pairs == 0 {
				return fmt.Errorf("build %c completed no pair", 'A'+i)
			}
		}
		rate = append(rate, res[1].PairsPerSec/res[0].PairsPerSec)
		cpu = append(cpu, pairCPU(res[1])/pairCPU(res[0]))
		for i, x := range res {
			c := x.CPUPerPairMS
			fmt.Printf("round %d: %c %.1f pairs/s; ms/pair controller %.3f, PostgreSQL %.3f, load generator %.3f, total %.3f\n",
				r+1, 'A'+i, x.PairsPerSec, c["controller"], c["postgres"], c["client"], pairCPU(x))
		}
	}
	fmt.Printf("B against A, median of %d rounds: rate %.3f (%s); CPU per pair %.3f (%s)\n",
		rounds, benchenv.Median(rate), list(rate), benchenv.Median(cpu), list(cpu))
	return nil
}

// pairCPU is a run's CPU per pair over every process it measured.
func pairCPU(r apibench.Result) float64 {
	return r.CPUPerPairMS["controller"] + r.CPUPerPairMS["postgres"] + r.CPUPerPairMS["client"]
}
