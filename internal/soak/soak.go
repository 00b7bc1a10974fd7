// Package soak runs the load soak: many HTTPS clients create and release slice
// allocations through the real controller against a fleet of enrolled gpuaas-hostd
// processes (sim runtime: the VM is the one simulated part; enrollment, mTLS, signed tasks,
// spooled results are real) while hosts are killed with SIGKILL and restarted at random. An
// invariant checker runs in SQL throughout; at the end every allocation must have settled,
// every slot must be back in service, and the controller's goroutines and memory must be
// within bounds of a baseline taken under the same load.
package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/bench/fanout"
	"github.com/gpuaas/gpuaas/internal/bench/provision"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/store"
)

// Options configures Run.
type Options struct {
	Dir       string        // work directory (PostgreSQL, controller and host state, logs)
	BinDir    string        // holds gpuaas-controller, gpuaas-hostd, gpuaasctl
	Hosts     int           // enrolled sim hosts (default 200)
	Clients   int           // concurrent API clients (default 64)
	Duration  time.Duration // load phase (default 2m)
	KillEvery time.Duration // mean time between hostd kills (default 3s; negative: none)
	Seed      uint64        // random choices (default: time-based, printed in the report)
	Logf      func(format string, args ...any)
}

func (o *Options) defaults() {
	if o.Hosts == 0 {
		o.Hosts = 200
	}
	if o.Clients == 0 {
		o.Clients = 64
	}
	if o.Duration == 0 {
		o.Duration = 2 * time.Minute
	}
	if o.KillEvery == 0 {
		o.KillEvery = 3 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	logf, t0 := o.Logf, time.Now()
	o.Logf = func(format string, args ...any) {
		logf("[%5.1fs] "+format, append([]any{time.Since(t0).Seconds()}, args...)...)
	}
}

// Controller settings the soak runs under: a killed host's task is redelivered after
// taskLease; an allocation not active within provisionTTL is failed by the reaper, which
// runs every few seconds (reapSlack).
const (
	taskLease    = 15 * time.Second
	provisionTTL = 2 * time.Minute
	reapSlack    = 30 * time.Second
	// releaseBound is how long a release may take before the checker calls it lost. The
	// release task's own deadline is 30 minutes; hosts here come back within seconds, so a
	// release outliving a few leases means the work was dropped.
	releaseBound = 2 * time.Minute
	// settleTimeout bounds the drain after the load stops.
	settleTimeout = provisionTTL + reapSlack + time.Minute
)

// Growth bounds: the controller's figures at the end of the load against the baseline taken
// under the same load after warm-up. Goroutines track connections and parked polls, so the
// bound is proportional with room for scheduling noise; RSS also allows for the Go heap
// settling at a higher goal.
const (
	goroutineGrowth = 1.25
	goroutineSlack  = 100
	rssGrowth       = 1.5
	rssSlackMiB     = 64
)

// Report is one soak's outcome.
type Report struct {
	Seed          uint64         `json:"seed"`
	Hosts         int            `json:"hosts"`
	Clients       int            `json:"clients"`
	SetupSeconds  float64        `json:"setup_seconds"`
	LoadSeconds   float64        `json:"load_seconds"`
	SettleSeconds float64        `json:"settle_seconds"`
	Operations    map[string]int `json:"operations"` // API calls by kind
	Failures      map[string]int `json:"failures"`   // "kind:code" for API errors, "allocation_failed:reason"
	Created       int            `json:"allocations_created"`
	Active        int            `json:"allocations_active"`
	Failed        int            `json:"allocations_failed"`
	Released      int            `json:"allocations_released"`
	ActiveP50ms   float64        `json:"create_to_active_p50_ms"`
	ActiveP99ms   float64        `json:"create_to_active_p99_ms"`
	Kills         int            `json:"hostd_kills"`
	KillsMidTask  int            `json:"hostd_kills_with_work_in_flight"`
	Redelivered   int            `json:"tasks_redelivered"` // leased again after their host died holding them
	Tasks         map[string]int `json:"tasks"`             // host tasks by "type status"
	Checks        int            `json:"invariant_checks"`
	Violations    []string       `json:"violations"` // distinct, as the checker reported them
	Memory        Memory         `json:"controller"`
}

// Memory is the controller's /metrics figures over the run.
type Memory struct {
	BaselineGoroutines int     `json:"baseline_goroutines"`
	FinalGoroutines    int     `json:"final_goroutines"`
	MaxGoroutines      int     `json:"max_goroutines"`
	BaselineRSSMiB     float64 `json:"baseline_rss_mib"`
	FinalRSSMiB        float64 `json:"final_rss_mib"`
	MaxRSSMiB          float64 `json:"max_rss_mib"`
	Samples            int     `json:"samples"`
}

// Run sets up the database, controller and fleet, runs the load for o.Duration, drains and
// checks. The report is returned (and should be written) even when err is not nil.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	rep := &Report{Seed: o.Seed, Hosts: o.Hosts, Clients: o.Clients, Operations: map[string]int{}, Failures: map[string]int{}, Tasks: map[string]int{}}
	if err := fanout.RaiseFileLimit(); err != nil { // the controller inherits it: a socket per host and client
		return rep, err
	}
	start := time.Now()
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: o.Dir, BinDir: o.BinDir,
		ExtraFlags: []string{"--task-lease", taskLease.String(), "--provision-ttl", provisionTTL.String()}})
	if err != nil {
		return rep, err
	}
	defer func() { env.Stop(); o.Logf("soak: controller and PostgreSQL stopped") }()
	o.Logf("soak: controller up; enrolling %d sim hosts (discover + approve each)", o.Hosts)
	fleet, err := provision.StartWith(ctx, env, o.BinDir, provision.Options{Hosts: o.Hosts, Prefix: "soak",
		PhaseDelay: 20 * time.Millisecond, Heartbeat: 10 * time.Second, MaxConcurrent: 8, Setup: 16})
	if err != nil {
		return rep, fmt.Errorf("fleet: %w", err)
	}
	defer func() { fleet.Stop(); o.Logf("soak: hosts stopped") }()
	rep.SetupSeconds = time.Since(start).Seconds()
	o.Logf("soak: %d hosts enrolled in %.0fs; %d clients for %s, a hostd kill -9 every ~%s", o.Hosts, rep.SetupSeconds, o.Clients, o.Duration, o.KillEvery)

	s := &run{o: o, env: env, fleet: fleet, rep: rep, rng: rand.New(rand.NewPCG(o.Seed, o.Seed>>1)), seen: map[string]bool{}, down: map[int]bool{}}
	if err := s.load(ctx); err != nil {
		return rep, err
	}
	return rep, s.verdict()
}

// run is one soak in progress.
type run struct {
	o     Options
	env   *benchenv.Env
	fleet *provision.Fleet

	mu      sync.Mutex
	rep     *Report
	rng     *rand.Rand
	seen    map[string]bool // violations already recorded
	down    map[int]bool    // hosts the killer has taken down on purpose
	actives []time.Duration
}

func (s *run) count(kind string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Operations[kind]++
	if err != nil {
		s.rep.Failures[kind+":"+errorCode(err)]++
	}
}

func (s *run) fail(key string) {
	s.mu.Lock()
	s.rep.Failures[key]++
	s.mu.Unlock()
}

func (s *run) violate(vs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range vs {
		if !s.seen[v] {
			s.seen[v] = true
			s.rep.Violations = append(s.rep.Violations, v)
			s.o.Logf("soak: INVARIANT VIOLATED: %s", v)
		}
	}
}

func (s *run) intn(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.IntN(n)
}

// load runs the clients, the killer, the checker and the sampler for the duration, then
// lets the clients finish their cycles and waits for the fleet to settle.
func (s *run) load(ctx context.Context) error {
	mon, err := newMonitor(s.env)
	if err != nil {
		return err
	}
	clients := make([]*client.Client, s.o.Clients)
	for i := range clients {
		if clients[i], err = s.env.Client(); err != nil {
			return err
		}
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, s.o.Duration)
	defer stopLoad()
	bg, stopBG := context.WithCancel(ctx)
	var bgDone sync.WaitGroup
	defer func() { stopBG(); bgDone.Wait() }() // nothing logs after the test returns
	bgDone.Add(4)
	go func() { defer bgDone.Done(); s.checker(bg) }()
	go func() { defer bgDone.Done(); s.watchdog(bg) }()
	go func() { defer bgDone.Done(); mon.sample(bg, s.o.Duration/5) }()
	killDone := make(chan struct{})
	go func() { defer bgDone.Done(); defer close(killDone); s.killer(loadCtx) }()

	began := time.Now()
	var running sync.WaitGroup
	errs := make(chan error, s.o.Clients)
	for i, c := range clients {
		running.Add(1)
		go func() {
			defer running.Done()
			if err := s.client(loadCtx, ctx, c, i); err != nil {
				errs <- err
			}
		}()
	}
	<-loadCtx.Done()
	mon.endLoad()
	<-killDone
	s.rep.LoadSeconds = time.Since(began).Seconds()
	s.o.Logf("soak: load over after %.0fs; clients finish their cycles, then the fleet settles", s.rep.LoadSeconds)
	running.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	o := s.o
	o.Logf("soak: clients done; settling")
	settleStart := time.Now()
	serr := s.settle(ctx)
	s.rep.SettleSeconds = time.Since(settleStart).Seconds()
	o.Logf("soak: settled in %.0fs", s.rep.SettleSeconds)
	s.checkOnce(ctx) // a last pass over the settled state
	if err := s.taskCounts(ctx); err != nil && serr == nil {
		serr = err
	}
	stopBG()
	bgDone.Wait()
	s.rep.Memory = mon.result()
	s.mu.Lock()
	s.rep.ActiveP50ms, s.rep.ActiveP99ms = benchenv.Percentile(s.actives, 50), benchenv.Percentile(s.actives, 99)
	s.mu.Unlock()
	return serr
}

// every calls fn at once and then every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		fn()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checker runs the SQL invariants every two seconds until ctx ends.
func (s *run) checker(ctx context.Context) { every(ctx, 2*time.Second, func() { s.checkOnce(ctx) }) }

func (s *run) checkOnce(ctx context.Context) {
	v, err := s.env.Store.InvariantsWithin(ctx, store.Deadlines{Provision: provisionTTL + reapSlack, Release: releaseBound})
	if err != nil {
		if ctx.Err() == nil {
			s.violate([]string{"invariant check failed to run: " + err.Error()})
		}
		return
	}
	s.mu.Lock()
	s.rep.Checks++
	s.mu.Unlock()
	s.violate(v)
}

// killer SIGKILLs a random host about every KillEvery (half of the time one with an
// allocation in motion, so kills land mid-task) and restarts it after up to two seconds.
func (s *run) killer(ctx context.Context) {
	if s.o.KillEvery < 0 {
		return
	}
	byName := map[string]int{}
	for i := 0; i < s.fleet.Len(); i++ {
		byName[s.fleet.Name(i)] = i
	}
	for {
		wait := s.o.KillEvery/2 + time.Duration(s.intn(int(s.o.KillEvery)+1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		i, busy := s.intn(s.fleet.Len()), false
		if s.intn(2) == 0 {
			var name string
			err := s.env.DB.QueryRow(ctx, `SELECT n.name FROM allocations a JOIN nodes n ON n.id = a.node_id
				WHERE a.status IN ('requested', 'provisioning', 'releasing') ORDER BY random() LIMIT 1`).Scan(&name)
			if j, ok := byName[name]; err == nil && ok {
				i, busy = j, true
			}
		}
		s.mu.Lock()
		s.down[i] = true
		s.mu.Unlock()
		if err := s.fleet.Kill(i); err != nil {
			s.violate([]string{"soak harness: " + err.Error()})
		}
		s.mu.Lock()
		s.rep.Kills++
		if busy {
			s.rep.KillsMidTask++
		}
		s.mu.Unlock()
		down := time.Duration(s.intn(2000)) * time.Millisecond
		select {
		case <-ctx.Done():
		case <-time.After(down):
		}
		if err := s.fleet.Restart(i); err != nil {
			s.violate([]string{"soak harness: restart: " + err.Error()})
		}
		s.mu.Lock()
		delete(s.down, i)
		s.mu.Unlock()
	}
}

// watchdog restarts, as systemd would, a hostd that exited without being killed, and
// records it as a violation: a crash (its log says why) is a bug even when nothing is lost.
func (s *run) watchdog(ctx context.Context) {
	every(ctx, time.Second, func() {
		for i := 0; i < s.fleet.Len(); i++ {
			s.mu.Lock()
			planned := s.down[i]
			s.mu.Unlock()
			if planned || s.fleet.Running(i) {
				continue
			}
			s.violate([]string{fmt.Sprintf("hostd %s exited by itself (crash; see %s)", s.fleet.Name(i), s.fleet.Log(i))})
			if err := s.fleet.Restart(i); err != nil && ctx.Err() == nil {
				s.violate([]string{"soak harness: restart: " + err.Error()})
			}
		}
	})
}

// settle waits until no allocation is in motion and every slot is available again (the sim
// runtime's wipe always verifies, so a slot left elsewhere is work that was lost), then
// records anything still unsettled as a violation.
func (s *run) settle(ctx context.Context) error {
	deadline := time.Now().Add(settleTimeout) // the killer has restarted its last host; the watchdog restarts crashed ones
	for {
		moving, err := s.env.Int(ctx, `SELECT count(*) FROM allocations WHERE status IN ('requested', 'provisioning', 'releasing')`)
		if err != nil {
			return err
		}
		busy, err := s.env.Int(ctx, `SELECT count(*) FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
			WHERE n.name LIKE 'soak-%' AND s.status <> 'available'`)
		if err != nil {
			return err
		}
		if moving == 0 && busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	rows, err := s.env.DB.Query(ctx, `SELECT 'allocation ' || id::text || ' still ' || status FROM allocations
			WHERE status IN ('requested', 'provisioning', 'releasing')
		UNION ALL SELECT 'slot ' || s.id::text || ' of ' || n.name || ' still ' || s.status || ' ' || s.status_reason
			FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id WHERE n.name LIKE 'soak-%' AND s.status <> 'available'`)
	if err != nil {
		return err
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			return err
		}
		left = append(left, "not settled "+settleTimeout.String()+" after the load: "+l)
	}
	s.violate(left)
	return rows.Err()
}

// taskCounts records the host tasks by type and status, and how many were redelivered.
func (s *run) taskCounts(ctx context.Context) error {
	rows, err := s.env.DB.Query(ctx, `SELECT type || ' ' || status, count(*), count(*) FILTER (WHERE attempt > 1) FROM node_tasks GROUP BY 1`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var n, again int
		if err := rows.Scan(&k, &n, &again); err != nil {
			return err
		}
		s.rep.Tasks[k] = n
		s.rep.Redelivered += again
	}
	return rows.Err()
}

// verdict turns the report into the test's error: any invariant violation, an allocation
// failed without a reason, no completed work, or controller growth beyond the bounds.
func (s *run) verdict() error {
	r := s.rep
	var problems []string
	if len(r.Violations) > 0 {
		problems = append(problems, fmt.Sprintf("%d invariant violations", len(r.Violations)))
	}
	if r.Active == 0 || r.Released == 0 {
		problems = append(problems, fmt.Sprintf("no completed work (%d active, %d released)", r.Active, r.Released))
	}
	if r.Failures["allocation_failed:"] > 0 {
		problems = append(problems, fmt.Sprintf("%d allocations failed without a reason", r.Failures["allocation_failed:"]))
	}
	m := r.Memory
	if m.Samples < 2 {
		problems = append(problems, "the controller's /metrics was not sampled")
	} else {
		if lim := int(float64(m.BaselineGoroutines)*goroutineGrowth) + goroutineSlack; m.FinalGoroutines > lim {
			problems = append(problems, fmt.Sprintf("controller goroutines grew from %d to %d (bound %d)", m.BaselineGoroutines, m.FinalGoroutines, lim))
		}
		if lim := m.BaselineRSSMiB*rssGrowth + rssSlackMiB; m.FinalRSSMiB > lim {
			problems = append(problems, fmt.Sprintf("controller RSS grew from %.0f to %.0f MiB (bound %.0f)", m.BaselineRSSMiB, m.FinalRSSMiB, lim))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("soak failed: %s", strings.Join(problems, "; "))
	}
	return nil
}

// Write saves the report as JSON and text in dir and returns the text.
func (r *Report) Write(dir string) (string, error) {
	text := r.Text()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return text, err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return text, err
	}
	if err := os.WriteFile(filepath.Join(dir, "soak-report.json"), b, 0o644); err != nil {
		return text, err
	}
	return text, os.WriteFile(filepath.Join(dir, "soak-report.txt"), []byte(text), 0o644)
}

// Text is the report for people.
func (r *Report) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak: %d clients, %d sim hosts, load %.0fs (setup %.0fs, settle %.0fs), seed %d\n", r.Clients, r.Hosts, r.LoadSeconds, r.SetupSeconds, r.SettleSeconds, r.Seed)
	fmt.Fprintf(&b, "allocations: %d created, %d active, %d failed, %d released; create->active p50 %.0f ms, p99 %.0f ms\n",
		r.Created, r.Active, r.Failed, r.Released, r.ActiveP50ms, r.ActiveP99ms)
	fmt.Fprintf(&b, "hostd kill -9: %d (%d on a host with an allocation in motion); host tasks redelivered after a kill: %d\n", r.Kills, r.KillsMidTask, r.Redelivered)
	fmt.Fprintf(&b, "host tasks: %s\n", sortedCounts(r.Tasks))
	fmt.Fprintf(&b, "operations: %s\n", sortedCounts(r.Operations))
	fmt.Fprintf(&b, "failures by code: %s\n", sortedCounts(r.Failures))
	m := r.Memory
	fmt.Fprintf(&b, "controller: goroutines %d -> %d (max %d), RSS %.0f -> %.0f MiB (max %.0f), %d samples\n",
		m.BaselineGoroutines, m.FinalGoroutines, m.MaxGoroutines, m.BaselineRSSMiB, m.FinalRSSMiB, m.MaxRSSMiB, m.Samples)
	fmt.Fprintf(&b, "invariant checks: %d; violations: %d\n", r.Checks, len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	return b.String()
}

func sortedCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
