// Command abtest compares two controller builds on this noisy machine by loading them at the
// same time: one PostgreSQL and fleet, a replica of each build, half the clients through each,
// in rounds. Both see the same machine at every moment, so drift falls on both, which
// measuring one build after the other cannot give (sequential rounds read several percent
// apart on builds that do the same work). It reports, per round and as medians, each build's
// pair rate, its controller's CPU per pair, and its PostgreSQL backends' CPU per pair (the
// backends serving its connections, told apart by application_name). Run it with -b the same
// directory as -a first: that A/A control is the measure's own noise.
//
// A change to placement cannot be compared that way: the two replicas' creates race each
// other's on the one fleet, and the change alters the race. With -apart each build has its own
// database and fleet, and the two take turns inside every round (the order reversed every
// other round); it reports each build's rate and its whole CPU per pair (controller,
// PostgreSQL and load generator, from /proc), and with -busy runs on fleets first filled to 80%
// of their GPUs through the API (apibench.Fill).
//
//	go run ./internal/bench/abtest -a /tmp/old -b bin
//	go run ./internal/bench/abtest -a /tmp/old -b bin -apart -seconds 6 -rounds 6
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/apibench"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

func main() {
	a := flag.String("a", "", "directory holding build A's gpuaas-controller")
	b := flag.String("b", "bin", "directory holding build B's gpuaas-controller")
	nodes := flag.Int("nodes", 500, "fleet size (nodes of 8 slots)")
	clients := flag.Int("clients", 16, "clients in all, half through each build")
	seconds := flag.Int("seconds", 8, "length of a round")
	rounds := flag.Int("rounds", 8, "rounds")
	apart := flag.Bool("apart", false, "each build its own database and fleet, taking turns (for placement changes); -clients all through each")
	busy := flag.Bool("busy", false, "with -apart: fill each fleet to 80% of its GPUs first")
	flag.Parse()
	if *a == "" || *clients < 2 || *seconds < 1 || *rounds < 1 || *nodes < 1 || *busy && !*apart {
		fmt.Fprintln(os.Stderr, "abtest: -a is required; -clients >= 2, -seconds, -rounds and -nodes >= 1; -busy only with -apart")
		os.Exit(2)
	}
	each := time.Duration(*seconds) * time.Second
	var err error
	if *apart {
		err = runApart(context.Background(), *a, *b, *nodes, *clients, each, *rounds, *busy)
	} else {
		err = run(context.Background(), *a, *b, *nodes, *clients, each, *rounds)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "abtest:", err)
		os.Exit(1)
	}
}

// arm is one build: its view of the environment and its backends' application_name.
type arm struct {
	name string
	env  *benchenv.Env
}

func run(ctx context.Context, binA, binB string, nodes, clients int, each time.Duration, rounds int) error {
	dir, err := os.MkdirTemp("", "abtest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: dir, BinDir: binA})
	if err != nil {
		return err
	}
	defer env.Stop()
	// Each controller connects with its own application_name: A restarted with it, B's
	// replica started with it.
	base := env.DBURL
	env.StopController()
	env.DBURL = base + " application_name=abtest-a"
	err = env.StartController(ctx, binA)
	env.DBURL = base + " application_name=abtest-b"
	var rep *benchenv.Env
	if err == nil {
		rep, err = env.Replica(ctx, binB, filepath.Join(dir, "b"))
	}
	env.DBURL = base
	if err != nil {
		return err
	}
	defer rep.StopController()
	arms := []arm{{"abtest-a", env}, {"abtest-b", env.Through(rep)}}
	if _, err := env.AddNodes(ctx, nodes); err != nil {
		return err
	}
	var rate, ctl, pg []float64
	for r := -1; r < rounds; r++ { // round -1 warms pools and plan caches
		if err := env.Heartbeat(ctx); err != nil {
			return err
		}
		if err := apibench.Cleanup(ctx, env); err != nil {
			return err
		}
		before, err := backendCPU(ctx, env)
		if err != nil {
			return err
		}
		var res [2]apibench.Result
		var errs [2]error
		var wg sync.WaitGroup
		for i, a := range arms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i], errs[i] = apibench.API(ctx, a.env, nodes, clients/2, each)
			}()
		}
		wg.Wait()
		after, err := backendCPU(ctx, env)
		if err != nil {
			return err
		}
		for i := range arms {
			if errs[i] != nil {
				return errs[i]
			}
			if res[i].Pairs == 0 {
				return fmt.Errorf("build %c completed no pair", 'A'+i)
			}
		}
		if r < 0 {
			continue
		}
		pgPair := func(i int) float64 {
			return float64((after[arms[i].name] - before[arms[i].name]).Microseconds()) / 1000 / float64(res[i].Pairs)
		}
		rate = append(rate, res[1].PairsPerSec/res[0].PairsPerSec)
		ctl = append(ctl, res[1].CPUPerPairMS["controller"]/res[0].CPUPerPairMS["controller"])
		pg = append(pg, pgPair(1)/pgPair(0))
		fmt.Printf("round %d: pairs/s A %.1f B %.1f; controller ms/pair A %.3f B %.3f; PostgreSQL backends ms/pair A %.3f B %.3f\n",
			r+1, res[0].PairsPerSec, res[1].PairsPerSec, res[0].CPUPerPairMS["controller"], res[1].CPUPerPairMS["controller"], pgPair(0), pgPair(1))
	}
	fmt.Printf("B against A, median of %d rounds: rate %.3f (%s); controller CPU per pair %.3f (%s); PostgreSQL backends' CPU per pair %.3f (%s)\n",
		rounds, benchenv.Median(rate), list(rate), benchenv.Median(ctl), list(ctl), benchenv.Median(pg), list(pg))
	return nil
}

// backendCPU sums the CPU of PostgreSQL's client backends by application_name, from /proc.
func backendCPU(ctx context.Context, env *benchenv.Env) (map[string]time.Duration, error) {
	rows, err := env.DB.Query(ctx, `SELECT pid, application_name FROM pg_stat_activity WHERE backend_type = 'client backend'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]time.Duration{}
	for rows.Next() {
		var pid int
		var app string
		if err := rows.Scan(&pid, &app); err != nil {
			return nil, err
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // exited since
		}
		if self, _, err := benchenv.StatCPU(string(stat)); err == nil {
			out[app] += self
		}
	}
	return out, rows.Err()
}

func list(xs []float64) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += " "
		}
		out += fmt.Sprintf("%.3f", x)
	}
	return out
}
