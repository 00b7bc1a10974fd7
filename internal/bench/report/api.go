package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/apibench"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// apiSuite is allocation throughput and latency through the HTTPS API
// beside the raw-SQL reference, on two fleet sizes, and the double-booking check.
type apiSuite struct {
	Fleets  []int `json:"fleets"`
	Clients []int `json:"clients"`
	// Rounds is how many times each (fleet, clients) pair of api and pgbench runs alternates at
	// 1 and 16 clients, RunSeconds long each; WideRounds and WideRunSeconds are the same at 64
	// clients. Targets use the median of the rounds' ratios.
	Rounds         int               `json:"rounds"`
	RunSeconds     float64           `json:"run_seconds"`
	WideRounds     int               `json:"wide_rounds"`
	WideRunSeconds float64           `json:"wide_run_seconds"`
	Results        []apibench.Result `json:"results"`
	DoubleBooked   int               `json:"double_booked_slots"`
	PGVersion      string            `json:"postgres_version"`
	// ControllerProcs is the GOMAXPROCS the controllers ran with (go_sched_gomaxprocs_threads:
	// --max-procs auto gives half the CPUs when PostgreSQL runs on the same machine).
	ControllerProcs int `json:"controller_gomaxprocs,omitempty"`
	// Wakeup is the wake-up measure's runs, the replicas taking turns (Notes names the
	// replica: a wakeArms name).
	Wakeup []apibench.Result  `json:"wakeup,omitempty"`
	Extra  map[string]float64 `json:"extra,omitempty"`
	// Statements is where PostgreSQL's time went in the 16-client runs on the largest fleet
	// (pg_stat_statements), by kind, with the pairs they completed.
	Statements map[string]statementRun `json:"statements,omitempty"`
	// StatementCPU is where PostgreSQL's CPU went, statement by statement, in one extra
	// 16-client run of each kind on the largest fleet (log_statement_stats), by kind.
	StatementCPU map[string]statementCPURun `json:"statement_cpu,omitempty"`
	// Busy is the largest fleet measured busy against empty (runBusy).
	Busy *busyRun `json:"busy,omitempty"`
}

type statementCPURun struct {
	Pairs int `json:"pairs"`
	// LoggedMS is the CPU every logged statement used; ProcPostgresMS what /proc counted for
	// PostgreSQL in the run (background processes and the logging itself included), both
	// in milliseconds per pair.
	LoggedMS       float64                 `json:"logged_ms_per_pair"`
	ProcPostgresMS float64                 `json:"proc_postgres_ms_per_pair"`
	Top            []benchenv.StatementCPU `json:"top"`
}

type statementRun struct {
	Pairs int                  `json:"pairs"`
	Top   []benchenv.Statement `json:"top"`
}

func runAPI(ctx context.Context, work, bin, out string, quick, profile bool) (*apiSuite, error) {
	// Rows are measured in interleaved rounds: api, pgbench, api, pgbench... This machine's
	// rates and latencies drift by 15-20% between runs tens of seconds apart, for pgbench as
	// much as for the API, so one long api run beside one long pgbench run settles nothing;
	// the ratio within each round, taken a few seconds apart, is what the targets use, and
	// their median over five rounds (three swung a verdict by up to 10 points between runs
	// minutes apart). 64 clients run longer rounds: pgbench's 64 connections in a run of a few
	// seconds measured a fifth to a tenth below their steady rate (start-up lock queues),
	// which would flatter the API. Three of them, so that the median is a round's ratio and
	// not the mean of two (one slow spell in either swung the 64-client verdict).
	s := &apiSuite{Fleets: []int{500, 5000}, Clients: []int{1, 16, 64}, Rounds: 5, RunSeconds: 5, WideRounds: 3, WideRunSeconds: 12}
	if quick {
		s.Fleets, s.Rounds, s.RunSeconds, s.WideRounds, s.WideRunSeconds = []int{500}, 2, 2.5, 1, 5
	}
	// Each fleet has its own database and controller, started side by side, and the fleets
	// take turns inside every round (500 nodes: api, pgbench; 5,000 nodes: api, pgbench), so
	// the 5,000-node rate is compared with the 500-node rate seconds apart as well: measured
	// one fleet after the other, minutes apart, that ratio read 67-139% on the same code.
	envs := make(map[int]*benchenv.Env, len(s.Fleets))
	defer func() {
		for _, env := range envs {
			env.Stop()
		}
	}()
	for _, fleet := range s.Fleets {
		env, err := benchenv.Start(ctx, benchenv.Options{Dir: filepath.Join(work, fmt.Sprintf("api-%d", fleet)), BinDir: bin, Pprof: profile, Statements: true})
		if err != nil {
			return nil, err
		}
		envs[fleet] = env
		if s.ControllerProcs == 0 {
			procs, err := env.Metric(ctx, "go_sched_gomaxprocs_threads")
			if err != nil {
				return nil, err
			}
			s.ControllerProcs = int(procs)
		}
		if s.PGVersion == "" {
			if err := env.DB.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&s.PGVersion); err != nil {
				return nil, err
			}
		}
		fmt.Printf("api: seeding %d nodes x 8 slots...\n", fleet)
		if _, err := env.AddNodes(ctx, fleet); err != nil {
			return nil, err
		}
		if err := apibench.PrepareRaw(ctx, env); err != nil {
			return nil, err
		}
		if err := apibench.PrepareMinimal(ctx, env, fleet); err != nil {
			return nil, fmt.Errorf("minimal reference: %w", err)
		}
		// Warm up (statistics, plan caches, connection pools) before anything is measured.
		if err := apibench.Cleanup(ctx, env); err != nil {
			return nil, err
		}
		if _, err := apibench.API(ctx, env, fleet, 4, 3*time.Second); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	for _, c := range s.Clients {
		rounds, each := s.plan(c)
		for round := 0; round < rounds; round++ {
			for _, fleet := range s.Fleets {
				if err := s.measureRound(ctx, envs[fleet], out, fleet, c, round, each, profile); err != nil {
					return nil, err
				}
			}
		}
	}
	fleet := s.Fleets[len(s.Fleets)-1]
	env := envs[fleet]
	_, each := s.plan(16)
	if err := s.measureStatementCPU(ctx, env, fleet, each); err != nil {
		return nil, err
	}
	var err error
	if s.Busy, err = runBusy(ctx, work, bin, env, fleet, quick); err != nil {
		return nil, err
	}
	s.DoubleBooked += s.Busy.DoubleBooked
	// The wake-up path's cost: the same 16-client run through three fresh controller replicas
	// on the same database, started together: one with its NOTIFY to other replicas on, two
	// with it off (polls on a replica itself are woken in process either way). They take
	// turns in rounds, the order rotated and reversed every round, so each sits in each place
	// equally often and drift falls on all three. The second "off" replica is an A/A control:
	// it differs from the first in nothing, so what it reads against it is the measure's own
	// noise. No restarts between runs (restarting before each run spread the rounds over 40
	// points), and all three are new, so none has another's history.
	// Six rounds: wakeOrder's three rotations, each forward and reversed, so every replica sits
	// in every place of the order exactly twice (eight left two places over-weighted).
	wakeRounds, wakeLen := 6, 6*time.Second
	if quick {
		wakeRounds, wakeLen = 1, 4*time.Second
	}
	env.StopController()
	views := map[string]*benchenv.Env{}
	for _, a := range wakeArms {
		rep, err := env.Replica(ctx, bin, filepath.Join(work, "api-wakeups-"+a.name), "--replica-wakeups="+strconv.FormatBool(a.on))
		if err != nil {
			return nil, fmt.Errorf("wake-up: replica: %w", err)
		}
		defer rep.StopController()
		views[a.name] = env.Through(rep)
	}
	for _, a := range wakeArms { // each replica's pools and plan caches
		if err := apibench.Cleanup(ctx, env); err != nil {
			return nil, err
		}
		if _, err := apibench.API(ctx, views[a.name], fleet, 4, time.Second); err != nil {
			return nil, fmt.Errorf("wake-up warm-up: %w", err)
		}
	}
	for round := 0; round < wakeRounds; round++ {
		for _, a := range wakeOrder(round) {
			if err := freshRun(ctx, env); err != nil {
				return nil, err
			}
			r, err := apibench.API(ctx, views[a.name], fleet, 16, wakeLen)
			if err != nil {
				return nil, fmt.Errorf("wake-ups %s: %w", a.name, err)
			}
			r.Round, r.Notes = round+1, a.name
			fmt.Printf("api: wake-up round %d: %s %.1f pairs/s (%d nodes, 16 clients)\n", round+1, a.name, r.PairsPerSec, fleet)
			s.Wakeup = append(s.Wakeup, r)
		}
	}
	return s, nil
}

// measureRound runs one round of (fleet, clients) on env: the API, then pgbench on our
// schema, then the minimal-schema reference, each from a clean, vacuumed and checkpointed
// fleet, and records all three with the double-booking check.
func (s *apiSuite) measureRound(ctx context.Context, env *benchenv.Env, out string, fleet, c, round int, each time.Duration, profile bool) error {
	for _, kind := range []string{"api", "pgbench", "minimal"} {
		if err := freshRun(ctx, env); err != nil {
			return err
		}
		stmts := c == 16 && fleet == s.Fleets[len(s.Fleets)-1] && round == 0
		if stmts {
			if err := env.ResetStatements(ctx); err != nil {
				return err
			}
		}
		var r apibench.Result
		var err error
		if kind == "api" {
			var prof chan error
			if profile && c == 16 && round == 0 {
				prof = make(chan error, 1)
				go func() {
					prof <- saveProfile(ctx, env, each-time.Second, filepath.Join(out, fmt.Sprintf("cpu-controller-%dnodes-16clients.pprof", fleet)))
				}()
			}
			r, err = runKind(ctx, env, kind, fleet, c, each)
			if prof != nil {
				if perr := <-prof; perr != nil {
					fmt.Println("api: profile:", perr)
				}
			}
		} else {
			r, err = runKind(ctx, env, kind, fleet, c, each)
		}
		if err != nil {
			return fmt.Errorf("%s %d nodes %d clients: %w", kind, fleet, c, err)
		}
		r.Round = round + 1
		if stmts {
			top, err := env.TopStatements(ctx, 12)
			if err != nil {
				return err
			}
			if s.Statements == nil {
				s.Statements = map[string]statementRun{}
			}
			s.Statements[kind] = statementRun{Pairs: r.Pairs, Top: top}
		}
		fmt.Printf("api: %-7s %5d nodes %2d clients round %d: %7.1f pairs/s  pair p50 %.1f ms p99 %.1f ms  create p50 %.1f ms  WAL %.1f KiB/pair  unplaced %d errors %v\n",
			kind, fleet, c, r.Round, r.PairsPerSec, r.PairP50ms, r.PairP99ms, r.CreateP50ms, r.WALPerPairKiB, r.Unplaced, r.Errors)
		s.Results = append(s.Results, r)
		n, err := apibench.DoubleBooked(ctx, env)
		if err != nil {
			return err
		}
		s.DoubleBooked += n
		if kind == "minimal" {
			if n, err = apibench.MinimalDoubleBooked(ctx, env); err != nil {
				return err
			}
			s.DoubleBooked += n
		}
	}
	return nil
}

// freshRun readies env for a measured run: every node's heartbeat fresh, the fleet empty,
// vacuumed and checkpointed (apibench.Cleanup), and the minimal reference's database, where
// there is one, the same.
func freshRun(ctx context.Context, env *benchenv.Env) error {
	if err := env.Heartbeat(ctx); err != nil {
		return err
	}
	if err := apibench.Cleanup(ctx, env); err != nil {
		return err
	}
	return apibench.CleanupMinimal(ctx, env)
}

// runKind runs the create+release loop through the API ("api"), the raw-SQL reference on our
// schema ("pgbench") or the same on the minimal schema ("minimal") for each.
func runKind(ctx context.Context, env *benchenv.Env, kind string, fleet, clients int, each time.Duration) (apibench.Result, error) {
	switch kind {
	case "api":
		return apibench.API(ctx, env, fleet, clients, each)
	case "minimal":
		return apibench.Minimal(ctx, env, fleet, clients, each)
	}
	return apibench.Pgbench(ctx, env, fleet, clients, each)
}

// measureStatementCPU runs the 16-client loop and pgbench once more on env, each with
// log_statement_stats on, and keeps where PostgreSQL's CPU went, statement by statement. The
// runs count toward no target: logging every statement slows them.
func (s *apiSuite) measureStatementCPU(ctx context.Context, env *benchenv.Env, fleet int, each time.Duration) error {
	for _, kind := range []string{"api", "pgbench"} {
		if err := freshRun(ctx, env); err != nil {
			return err
		}
		var r apibench.Result
		top, logged, err := env.MeasureStatementCPU(ctx, func() (err error) {
			r, err = runKind(ctx, env, kind, fleet, 16, each)
			return err
		})
		if err != nil {
			return fmt.Errorf("statement CPU, %s: %w", kind, err)
		}
		if r.Pairs == 0 {
			return fmt.Errorf("statement CPU, %s: no pair completed", kind)
		}
		if s.StatementCPU == nil {
			s.StatementCPU = map[string]statementCPURun{}
		}
		s.StatementCPU[kind] = statementCPURun{Pairs: r.Pairs, LoggedMS: logged / float64(r.Pairs),
			ProcPostgresMS: r.CPUPerPairMS["postgres"], Top: top[:min(len(top), 16)]}
		fmt.Printf("api: statement CPU, %s: %.2f ms per pair logged (PostgreSQL %.2f from /proc), %d pairs\n", kind, logged/float64(r.Pairs), r.CPUPerPairMS["postgres"], r.Pairs)
		n, err := apibench.DoubleBooked(ctx, env)
		if err != nil {
			return err
		}
		s.DoubleBooked += n
	}
	return nil
}

func (s *apiSuite) find(kind string, nodes, clients, round int) apibench.Result {
	for _, r := range s.Results {
		if r.Kind == kind && r.Nodes == nodes && r.Clients == clients && r.Round == round {
			return r
		}
	}
	return apibench.Result{}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func (s *apiSuite) markdown() string {
	var b strings.Builder
	// Rows by fleet, clients and round (they ran with the fleets taking turns).
	rows := slices.Clone(s.Results)
	slices.SortStableFunc(rows, func(x, y apibench.Result) int {
		return cmp.Or(cmp.Compare(x.Nodes, y.Nodes), cmp.Compare(x.Clients, y.Clients), cmp.Compare(x.Round, y.Round))
	})
	fmt.Fprintf(&b, "## Allocation throughput and latency (items 1, 2)\n\nPostgreSQL %s, private cluster with the controller's production settings (fsync on). Each (fleet, clients) row is %d interleaved rounds of %g s of each kind at 1 and 16 clients (api, pgbench, api, ...) and %d of %g s at 64 clients (pgbench's 64 connections need longer to reach a steady rate); each fleet has its own database and controller, and the fleets take turns inside every round: the machine drifts between runs, so targets use each round's ratios and their median. **api**: N workers, each with its own HTTPS connection (HTTP/1.1 keep-alive, prebuilt requests written straight to the TLS connection and every answer checked: a lean load generator, as pgbench's libpq loop is) and a tenant token, creating a 4-GPU allocation and releasing it (cancel before provisioning) in a loop: auth, JSON, scheduler, transaction, audit, outbox. **pgbench**: the raw-SQL reference against the same database, `-M prepared`: lock 4 available slots of a random node `FOR UPDATE SKIP LOCKED`, insert the allocation and claims; then release them. **minimal**: the same script, statement for statement, on a minimal schema in its own database of the same cluster (same server, settings and disk): slots with a status and a primary key, allocations, claims; no triggers, audit, outbox or secondary index: what the reservation costs when the database holds no guarantee beyond the row lock. All three share the machine's %d cores with their load generator; each controller schedules on %d of them (`--max-procs auto`: half when PostgreSQL runs on the same machine, so Go's idle processors do not spin on the database's cores).\n\n", s.PGVersion, s.Rounds, s.RunSeconds, s.WideRounds, s.WideRunSeconds, runtime.NumCPU(), s.ControllerProcs)
	b.WriteString("| nodes | clients | round | kind | pairs/s | pair p50 ms | pair p99 ms | create p50 ms | create p99 ms | unplaced | errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		errs, _ := json.Marshal(r.Errors)
		cp50, cp99 := fmt.Sprintf("%.2f", r.CreateP50ms), fmt.Sprintf("%.2f", r.CreateP99ms)
		if r.Kind != "api" {
			cp50, cp99 = "-", "-"
		}
		fmt.Fprintf(&b, "| %d | %d | %d | %s | %.1f | %.2f | %.2f | %s | %s | %d | %s |\n", r.Nodes, r.Clients, r.Round, r.Kind, r.PairsPerSec, r.PairP50ms, r.PairP99ms, cp50, cp99, r.Unplaced, errs)
	}
	b.WriteString("\n**CPU per pair** (user + system ms per create+release pair, from /proc: the controller, every PostgreSQL process including exited backends, and the load generator: the API workers in the bench process or pgbench). On 2 cores a rate is bounded by the CPU a pair costs, so the total's ratio is the rate ratio the machine allows. WAL: KiB of WAL written per pair (PostgreSQL's insert position before and after the run), full-page images included: what the pair's commits wait to flush. Unmeasured: the machine's busy CPU (/proc/stat) beyond the run's own processes, per pair: the other fleet's database and controller (their background work after the previous run), kernel work charged to no process. Idle: the share of the machine's CPU time nothing used.\n\n")
	b.WriteString("| nodes | clients | round | kind | controller | postgres | load generator | total | total vs reference | WAL KiB | unmeasured | idle |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.CPUPerPairMS == nil {
			continue
		}
		c := r.CPUPerPairMS
		gen, ctl := c["client"], fmt.Sprintf("%.2f", c["controller"])
		if r.Kind != "api" {
			gen, ctl = c["pgbench"], "-"
		}
		vs := "-"
		if p := s.find("pgbench", r.Nodes, r.Clients, r.Round); r.Kind == "api" && p.CPUPerPairMS != nil {
			vs = fmt.Sprintf("%.2fx raw", ratio(totalCPU(r), totalCPU(p)))
		}
		if m := s.find("minimal", r.Nodes, r.Clients, r.Round); r.Kind == "pgbench" && m.CPUPerPairMS != nil {
			vs = fmt.Sprintf("%.2fx minimal", ratio(totalCPU(r), totalCPU(m)))
		}
		fmt.Fprintf(&b, "| %d | %d | %d | %s | %s | %.2f | %.2f | %.2f | %s | %.1f | %.2f | %.0f%% |\n", r.Nodes, r.Clients, r.Round, r.Kind, ctl, c["postgres"], gen, totalCPU(r), vs, r.WALPerPairKiB, r.OtherCPUPerPairMS, r.IdleShare*100)
	}
	for _, kind := range []string{"api", "pgbench"} {
		run, ok := s.Statements[kind]
		if !ok || run.Pairs == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n**Where PostgreSQL's time went, %s, 16 clients, %d nodes, round 1** (pg_stat_statements: execution time, wall, lock waits included; per completed pair)\n\n| statement | calls/pair | ms/pair | rows/call |\n|---|---|---|---|\n", kind, s.Fleets[len(s.Fleets)-1])
		for _, st := range run.Top {
			q := strings.ReplaceAll(st.Query, "|", "\\|")
			fmt.Fprintf(&b, "| `%s` | %.2f | %.3f | %.1f |\n", q, float64(st.Calls)/float64(run.Pairs), st.TotalMS/float64(run.Pairs), ratio(float64(st.Rows), float64(st.Calls)))
		}
	}
	for _, kind := range []string{"api", "pgbench"} {
		run, ok := s.StatementCPU[kind]
		if !ok || run.Pairs == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n**Where PostgreSQL's CPU went, %s, 16 clients, %d nodes** (a run of its own with `log_statement_stats` on: each statement's backend CPU, parse, bind (for a SELECT, the executor's start-up) and execute, no waiting counted; per completed pair. Logged in all: %.2f ms per pair, of %.2f ms PostgreSQL used by /proc, which also counts background processes and the logging)\n\n| statement | runs/pair | CPU ms/pair |\n|---|---|---|\n",
			kind, s.Fleets[len(s.Fleets)-1], run.LoggedMS, run.ProcPostgresMS)
		for _, st := range run.Top {
			if st.CPUms/float64(run.Pairs) < 0.0005 { // the harness's own statements
				continue
			}
			q := strings.ReplaceAll(st.Query, "|", "\\|")
			if q == "" {
				q = "(no statement: a protocol message outside one)"
			}
			fmt.Fprintf(&b, "| `%s` | %.2f | %.3f |\n", q, float64(st.Executes)/float64(run.Pairs), st.CPUms/float64(run.Pairs))
		}
	}
	if s.Busy != nil {
		s.Busy.markdown(&b)
	}
	b.WriteString("\n**Targets**\n\n")
	for _, fleet := range s.Fleets {
		for _, c := range []int{16, 64} {
			qs := s.roundRatios(fleet, c, func(a, p apibench.Result) float64 { return ratio(a.PairsPerSec, p.PairsPerSec) })
			q := benchenv.Median(qs)
			cpu := s.roundRatios(fleet, c, func(a, p apibench.Result) float64 { return ratio(totalCPU(a), totalCPU(p)) })
			cq := benchenv.Median(cpu)
			fmt.Fprintf(&b, "- %d nodes, %d clients: API at %.1f%% of the raw-SQL rate, median of %d rounds (rounds %s) (target >= 50%%): %s. CPU per pair %.2fx the raw script's (median; rounds %s) (target <= 1.6x): %s.\n",
				fleet, c, q*100, len(qs), percentList(qs), verdict(q >= 0.5), cq, ratioList(cpu), verdict(cq > 0 && cq <= 1.6))
			ms := s.kindRatios("pgbench", "minimal", fleet, c, func(p, m apibench.Result) float64 { return ratio(p.PairsPerSec, m.PairsPerSec) })
			m := benchenv.Median(ms)
			mc := benchenv.Median(s.kindRatios("pgbench", "minimal", fleet, c, func(p, m apibench.Result) float64 { return ratio(totalCPU(p), totalCPU(m)) }))
			fmt.Fprintf(&b, "- %d nodes, %d clients: the raw script on our schema at %.1f%% of the minimal schema's rate, median of %d rounds (rounds %s) (target >= 66%%): %s. CPU per pair %.2fx the minimal schema's (median).\n",
				fleet, c, m*100, len(ms), percentList(ms), verdict(m >= 0.66), mc)
		}
		var wal []float64
		for _, r := range s.Results {
			if r.Kind == "api" && r.Nodes == fleet && r.Clients >= 16 && r.Pairs > 0 {
				wal = append(wal, r.WALPerPairKiB)
			}
		}
		w := benchenv.Median(wal)
		fmt.Fprintf(&b, "- %d nodes: WAL per pair through the API at 16 and 64 clients, median of %d runs %.1f KiB (target <= 12 KiB): %s.\n",
			fleet, len(wal), w, verdict(w > 0 && w <= 12))
		qs := s.roundRatios(fleet, 1, func(a, p apibench.Result) float64 { return ratio(a.PairP50ms, p.PairP50ms) })
		q := benchenv.Median(qs)
		fmt.Fprintf(&b, "- %d nodes, 1 client: pair p50 against the raw script's, median of %d rounds %.2fx (rounds %s) (target <= 2x): %s.",
			fleet, len(qs), q, ratioList(qs), verdict(q > 0 && q <= 2))
		// The issue compares "create latency" with pgbench's per-transaction latency; the raw
		// script's transaction is a reserve and a release, so the verdict above compares pair
		// with pair. The create alone against the same is shown too, for the reader; it is not
		// the verdict.
		if cs := s.roundRatios(fleet, 1, func(a, p apibench.Result) float64 { return ratio(a.CreateP50ms, p.PairP50ms) }); len(cs) > 0 {
			fmt.Fprintf(&b, " The API's create alone against the raw script's whole pair (reserve and release): median %.2fx (rounds %s); not the verdict.", benchenv.Median(cs), ratioList(cs))
		}
		b.WriteString("\n")
	}
	if len(s.Fleets) > 1 {
		small, big := s.Fleets[0], s.Fleets[len(s.Fleets)-1]
		for _, c := range s.Clients {
			qs := s.fleetRatios(small, big, c)
			q := benchenv.Median(qs)
			fmt.Fprintf(&b, "- %d clients: %d-node rate is %.0f%% of the %d-node rate, median of %d rounds (rounds %s) (target >= 80%%): %s.\n", c, big, q*100, small, len(qs), percentList(qs), verdict(q >= 0.8))
		}
	}
	if s.Busy != nil {
		s.Busy.target(&b)
	}
	s.wakeupMarkdown(&b)
	fmt.Fprintf(&b, "- double-booked slots after every run, checked in SQL (a slot with two live claims, or a live claim on an available slot): %d (target 0): %s.\n", s.DoubleBooked, verdict(s.DoubleBooked == 0))
	return b.String()
}

// totalCPU is a run's CPU per pair over every process it measured (see apibench.Result).
func totalCPU(r apibench.Result) float64 {
	var t float64
	for _, v := range r.CPUPerPairMS {
		t += v
	}
	return t
}

// plan is how many interleaved rounds a client count runs and how long each run is (see
// runAPI: more clients, fewer and longer rounds).
func (s *apiSuite) plan(clients int) (rounds int, each time.Duration) {
	if clients > 16 {
		return s.WideRounds, time.Duration(s.WideRunSeconds * float64(time.Second))
	}
	return s.Rounds, time.Duration(s.RunSeconds * float64(time.Second))
}

// roundRatios is f(api run, pgbench run) for each round of (fleet, clients).
func (s *apiSuite) roundRatios(fleet, clients int, f func(a, p apibench.Result) float64) []float64 {
	return s.kindRatios("api", "pgbench", fleet, clients, f)
}

// kindRatios is f(run of kind x, run of kind y) for each round of (fleet, clients).
func (s *apiSuite) kindRatios(x, y string, fleet, clients int, f func(a, b apibench.Result) float64) []float64 {
	var out []float64
	rounds, _ := s.plan(clients)
	for round := 1; round <= rounds; round++ {
		a, b := s.find(x, fleet, clients, round), s.find(y, fleet, clients, round)
		if a.Pairs > 0 && b.Pairs > 0 {
			out = append(out, f(a, b))
		}
	}
	return out
}

// fleetRatios is the API's rate on the big fleet over its rate on the small one, for each
// round of clients (the fleets take turns inside a round).
func (s *apiSuite) fleetRatios(small, big, clients int) []float64 {
	var out []float64
	rounds, _ := s.plan(clients)
	for round := 1; round <= rounds; round++ {
		a, b := s.find("api", small, clients, round), s.find("api", big, clients, round)
		if a.Pairs > 0 && b.Pairs > 0 {
			out = append(out, ratio(b.PairsPerSec, a.PairsPerSec))
		}
	}
	return out
}

// median of xs (the mean of the middle two for an even count); 0 for none.
func joinf(xs []float64, format string, scale float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x*scale)
	}
	return strings.Join(parts, ", ")
}

func ratioList(xs []float64) string   { return joinf(xs, "%.2fx", 1) }
func rateList(xs []float64) string    { return joinf(xs, "%.1f", 1) }
func percentList(xs []float64) string { return joinf(xs, "%.0f%%", 100) }

func writeJSON(path string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, js, 0o644)
}

// saveProfile saves a CPU profile of the controller taken over d.
func saveProfile(ctx context.Context, env *benchenv.Env, d time.Duration, path string) error {
	b, err := env.Pprof(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", max(int(d.Seconds()), 1)))
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
