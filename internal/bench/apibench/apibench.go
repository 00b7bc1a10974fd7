// Package apibench measures allocation throughput and latency through the full HTTPS API
// (auth, JSON, scheduler, transaction, outbox) and, against the same PostgreSQL, a raw-SQL
// reference run by pgbench: the same reserve (FOR UPDATE SKIP LOCKED on four slots of one
// node, an allocation and its claims inserted) and release, with no API, no ranking and no
// audit: the reference for the API throughput and latency targets. The same script on a
// minimal schema (Minimal) is the reference for what our schema's guarantees cost.
package apibench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// GPUs per request: four slots, one NUMA group, as in the raw script.
const GPUs = 4

// Result is one measured configuration.
type Result struct {
	Kind        string         `json:"kind"` // "api", "pgbench" (the raw script on our schema) or "minimal"
	Nodes       int            `json:"nodes"`
	Clients     int            `json:"clients"`
	Round       int            `json:"round,omitempty"` // which of a row's interleaved rounds (1-based; 0: not part of one)
	Seconds     float64        `json:"seconds"`
	Pairs       int            `json:"pairs"`         // create+release pairs completed
	PairsPerSec float64        `json:"pairs_per_sec"` //
	PairP50ms   float64        `json:"pair_p50_ms"`   // create+release, one pair
	PairP99ms   float64        `json:"pair_p99_ms"`   //
	CreateP50ms float64        `json:"create_p50_ms"` // create alone (api) / reserve transaction (pgbench)
	CreateP99ms float64        `json:"create_p99_ms"` //
	Unplaced    int            `json:"unplaced"`      // creates refused for capacity (retryable)
	Errors      map[string]int `json:"errors"`        // other failures by error code
	// CPUPerPairMS is CPU time per completed pair by process: controller, postgres and
	// client (this process's API workers) for api; postgres and pgbench for the reference.
	CPUPerPairMS map[string]float64 `json:"cpu_per_pair_ms,omitempty"`
	// WALPerPairKiB is the WAL PostgreSQL wrote per completed pair, full-page images included.
	WALPerPairKiB float64 `json:"wal_per_pair_kib,omitempty"`
	// OtherCPUPerPairMS is the machine's busy CPU the run did not measure (benchenv.CPU: the
	// other fleet's database and controller, unattributed kernel work), per pair; IdleShare is
	// the share of the machine's CPU time that was idle during the run.
	OtherCPUPerPairMS float64 `json:"other_cpu_per_pair_ms"`
	IdleShare         float64 `json:"idle_share"`
	Notes             string  `json:"notes,omitempty"` //
}

// API runs clients workers, each with its own HTTPS connection (a wire client, as lean as
// pgbench's libpq loop), creating and releasing 4-GPU allocations for d.
func API(ctx context.Context, env *benchenv.Env, nodes, clients int, d time.Duration) (Result, error) {
	res := Result{Kind: "api", Nodes: nodes, Clients: clients, Errors: map[string]int{}}
	var mu sync.Mutex
	var pairs, creates []time.Duration
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	errc := make(chan error, clients)
	cpu0, err := env.CPUNow()
	if err != nil {
		return res, err
	}
	wal0, err := env.WALNow(ctx)
	if err != nil {
		return res, err
	}
	start := time.Now()
	for w := 0; w < clients; w++ {
		c, err := newWire(env.Server, env.CAFile, env.Token)
		if err != nil {
			return res, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			var myPairs, myCreates []time.Duration
			unplaced := 0
			errs := map[string]int{}
			for time.Now().Before(stop) && ctx.Err() == nil {
				t0 := time.Now()
				id, err := c.Create(ctx)
				t1 := time.Now()
				if err != nil {
					if isUnavailable(err) {
						unplaced++
						continue
					}
					errs[code(err)]++
					if len(errs) > 0 && errs[code(err)] > 100 {
						errc <- fmt.Errorf("create: %w", err)
						return
					}
					continue
				}
				if err := c.Release(ctx, id); err != nil {
					errs["release:"+code(err)]++
					continue
				}
				myCreates = append(myCreates, t1.Sub(t0))
				myPairs = append(myPairs, time.Since(t0))
			}
			mu.Lock()
			pairs = append(pairs, myPairs...)
			creates = append(creates, myCreates...)
			res.Unplaced += unplaced
			for k, v := range errs {
				res.Errors[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	cpu1, err := env.CPUNow()
	if err != nil {
		return res, err
	}
	wal1, err := env.WALNow(ctx)
	if err != nil {
		return res, err
	}
	select {
	case err := <-errc:
		return res, err
	default:
	}
	res.Pairs = len(pairs)
	used := cpu1.Sub(cpu0)
	res.CPUPerPairMS = perPair(res.Pairs, map[string]time.Duration{"controller": used.Controller, "postgres": used.Postgres, "client": used.Self})
	res.OtherCPUPerPairMS, res.IdleShare = machineRest(res.Pairs, used, used.Controller+used.Postgres+used.Self)
	res.WALPerPairKiB = walPerPair(res.Pairs, wal1-wal0)
	res.PairsPerSec = float64(len(pairs)) / res.Seconds
	res.PairP50ms, res.PairP99ms = benchenv.Percentile(pairs, 50), benchenv.Percentile(pairs, 99)
	res.CreateP50ms, res.CreateP99ms = benchenv.Percentile(creates, 50), benchenv.Percentile(creates, 99)
	return res, nil
}

// machineRest is the machine's busy CPU beyond measured, per pair in milliseconds, and its
// idle share, over used (0, 0 when no pair completed or /proc/stat moved by nothing).
func machineRest(pairs int, used benchenv.CPU, measured time.Duration) (otherMS, idle float64) {
	total := used.Busy + used.Idle
	if pairs == 0 || total <= 0 {
		return 0, 0
	}
	return float64((used.Busy - measured).Microseconds()) / 1000 / float64(pairs), float64(used.Idle) / float64(total)
}

// walPerPair is WAL bytes per pair in KiB (0 when no pair completed).
func walPerPair(pairs int, bytes int64) float64 {
	if pairs == 0 {
		return 0
	}
	return float64(bytes) / 1024 / float64(pairs)
}

// perPair divides each CPU time by pairs, in milliseconds (nil when no pair completed).
func perPair(pairs int, used map[string]time.Duration) map[string]float64 {
	if pairs == 0 {
		return nil
	}
	out := make(map[string]float64, len(used))
	for k, d := range used {
		out[k] = float64(d.Microseconds()) / 1000 / float64(pairs)
	}
	return out
}

func code(err error) string {
	var ae *apiv1.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return "transport"
}

// reserveRelease is the raw-SQL reference: the same rows our Create and cancel-Release write
// (four slots locked SKIP LOCKED and moved to reserved, an allocation, four claims; then the
// claims released, the slots made available and the allocation ended), without ranking,
// audit, outbox, idempotency or the API.
const reserveRelease = `\set node random(1, :nodes)
BEGIN;
SELECT array_agg(id) AS ids, count(*) AS n FROM (
  SELECT s.id FROM node_resource_slots s
  WHERE s.node_id = (SELECT id FROM bench_nodes WHERE ord = :node) AND s.status = 'available'
  ORDER BY s.slot_index LIMIT 4 FOR UPDATE SKIP LOCKED) x \gset
\if :n = 4
UPDATE node_resource_slots SET status = 'reserved' WHERE id = ANY(:ids::uuid[]);
INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
  SELECT :tenant::uuid, 'h200-sxm-slice', 'gpu_slice', 4, '', (SELECT id FROM bench_nodes WHERE ord = :node), '{}'
  RETURNING id AS alloc \gset
INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, fabric_vf_pci_address, resource_snapshot, device_snapshot_id)
  SELECT :alloc::uuid, node_id, id, 'slot', capacity_metadata->>'fabric_vf_pci_address', '{}', device_snapshot_id
  FROM node_resource_slots WHERE id = ANY(:ids::uuid[]);
COMMIT;
BEGIN;
SELECT id FROM allocations WHERE id = :alloc::uuid FOR UPDATE;
UPDATE allocations SET status = 'releasing', releasing_at = now() WHERE id = :alloc::uuid;
UPDATE node_resource_slots SET status = 'available' WHERE id = ANY(:ids::uuid[]);
UPDATE allocation_resource_claims SET status = 'released', released_at = now() WHERE allocation_id = :alloc::uuid;
UPDATE allocations SET status = 'released', released_at = now(), placement_status = 'released' WHERE id = :alloc::uuid;
COMMIT;
\else
COMMIT;
\endif
`

// PrepareRaw creates the node-ordinal table the raw script picks nodes from.
func PrepareRaw(ctx context.Context, env *benchenv.Env) error {
	return env.Exec(ctx, `DROP TABLE IF EXISTS bench_nodes;
		CREATE TABLE bench_nodes AS SELECT row_number() OVER (ORDER BY name)::int AS ord, id FROM nodes;
		ALTER TABLE bench_nodes ADD PRIMARY KEY (ord)`)
}

var (
	tpsRE = regexp.MustCompile(`tps = ([0-9.]+)`)
	cntRE = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)
)

// Pgbench runs the raw-SQL reference with clients connections for d (pgbench -M prepared,
// one thread per core) and reads per-pair latencies from its transaction log.
func Pgbench(ctx context.Context, env *benchenv.Env, nodes, clients int, d time.Duration) (Result, error) {
	return pgbench(ctx, env, "pgbench", "postgres", reserveRelease, nodes, clients, d)
}

// pgbench runs script against database (pgbench -M prepared, one thread per core, the
// variables nodes and tenant set) and measures it as a Result of kind.
func pgbench(ctx context.Context, env *benchenv.Env, kind, database, script string, nodes, clients int, d time.Duration) (Result, error) {
	res := Result{Kind: kind, Nodes: nodes, Clients: clients, Errors: map[string]int{}}
	dir, err := os.MkdirTemp(env.Dir, "pgbench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "reserve_release.sql")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		return res, err
	}
	threads := min(clients, 2)
	args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(threads),
		"-T", strconv.Itoa(int(d.Seconds())), "-D", fmt.Sprintf("nodes=%d", nodes), "-D", "tenant=" + env.TenantID,
		"-f", file, "-l", "--log-prefix", filepath.Join(dir, "log"),
		"-h", env.PG.SocketDir(), "-U", "gpuaas", database}
	cmd := exec.CommandContext(ctx, "pgbench", args...)
	cpu0, err := env.CPUNow()
	if err != nil {
		return res, err
	}
	wal0, err := env.WALNow(ctx)
	if err != nil {
		return res, err
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return res, fmt.Errorf("pgbench: %v\n%s", err, out)
	}
	cpu1, err := env.CPUNow()
	if err != nil {
		return res, err
	}
	wal1, err := env.WALNow(ctx)
	if err != nil {
		return res, err
	}
	var client time.Duration
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		client = benchenv.RusageCPU(ru)
	}
	res.Seconds = time.Since(start).Seconds()
	if m := tpsRE.FindSubmatch(out); m != nil {
		res.PairsPerSec, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := cntRE.FindSubmatch(out); m != nil {
		res.Pairs, _ = strconv.Atoi(string(m[1]))
	}
	lat, err := readLogs(dir)
	if err != nil {
		return res, err
	}
	res.PairP50ms, res.PairP99ms = benchenv.Percentile(lat, 50), benchenv.Percentile(lat, 99)
	// The reserve transaction alone is about half the pair (two transactions of similar size);
	// pgbench logs whole scripts, so create latency is not reported separately.
	used := cpu1.Sub(cpu0)
	res.CPUPerPairMS = perPair(res.Pairs, map[string]time.Duration{"postgres": used.Postgres, "pgbench": client})
	res.OtherCPUPerPairMS, res.IdleShare = machineRest(res.Pairs, used, used.Postgres+client)
	res.WALPerPairKiB = walPerPair(res.Pairs, wal1-wal0)
	res.Notes = "latency per script (reserve + release transactions)"
	if res.Pairs == 0 {
		return res, fmt.Errorf("pgbench processed no transactions:\n%s", out)
	}
	return res, nil
}

// readLogs collects the latency column (microseconds, third field) of pgbench's per-thread
// transaction logs.
func readLogs(dir string) ([]time.Duration, error) {
	files, err := filepath.Glob(filepath.Join(dir, "log*"))
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fs[2], 10, 64)
			if err == nil {
				out = append(out, time.Duration(us)*time.Microsecond)
			}
		}
		fh.Close()
	}
	return out, nil
}

// DoubleBooked counts slots holding more than one live claim, and live claims whose slot is
// available (both must be zero).
func DoubleBooked(ctx context.Context, env *benchenv.Env) (int, error) {
	return env.Int(ctx, `SELECT
		(SELECT count(*) FROM (SELECT slot_id FROM allocation_resource_claims
		   WHERE slot_id IS NOT NULL AND status NOT IN ('released', 'failed') GROUP BY slot_id HAVING count(*) > 1) x)
		+ (SELECT count(*) FROM allocation_resource_claims c JOIN node_resource_slots s ON s.id = c.slot_id
		   WHERE c.status NOT IN ('released', 'failed') AND s.status = 'available')`)
}

// Cleanup ends what a run left (raw-script allocations and any stragglers) so the next run
// starts from an empty fleet.
func Cleanup(ctx context.Context, env *benchenv.Env) error {
	err := env.Exec(ctx, `UPDATE node_resource_slots SET status = 'available' WHERE status = 'reserved';
		UPDATE allocation_resource_claims SET status = 'released', released_at = now() WHERE status NOT IN ('released', 'failed');
		UPDATE allocations SET status = 'releasing' WHERE status = 'requested';
		UPDATE allocations SET status = 'released', released_at = now() WHERE status = 'releasing'`)
	if err != nil {
		return err
	}
	// Every row starts from the same state: vacuumed, analyzed and checkpointed (the vacuum's
	// writes flushed, and the checkpoint's full-page images paid at every row's start rather
	// than by whichever row a timed checkpoint happens to land in).
	return Settle(ctx, env)
}
