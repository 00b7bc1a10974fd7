package faults

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// createOutcome is one create under load: its idempotency key and what the client saw.
type createOutcome struct {
	key     string
	id      string // set on success
	err     error
	crashed bool // in flight while PostgreSQL crashed
}

// PostgreSQL restarts twice while tenants create allocations through the controller: a fast
// shutdown (every backend terminated mid-statement) and a crash (all its processes SIGKILLed). The controller recovers without a restart;
// requests that failed did so with a retryable 503 "unavailable" carrying Retry-After, never
// a 500; every create that succeeded exists; none that failed does, except where the crash
// took the answer to a commit that had reached the disk (then it is whole, and the same
// idempotency key returns it); a retry with the same key succeeds exactly once; and the
// invariants hold (nothing half-applied).
func TestPostgresRestartUnderLoad(t *testing.T) {
	c := newCluster(t, 1)
	if _, err := c.A.AddNodes(c.ctx, 24); err != nil { // 192 GPUs, more than is asked
		t.Fatal(err)
	}
	pid := c.A.PID()
	var (
		mu       sync.Mutex
		outcomes []createOutcome
		stop     atomic.Bool
		crashing atomic.Int32 // the crash phase number, once it begins
		wg       sync.WaitGroup
		seq      atomic.Int32
	)
	for w := 0; w < 6; w++ {
		cl := c.tenant(c.A.Server)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && seq.Load() < 150 {
				key := fmt.Sprintf("load-%d", seq.Add(1))
				began := crashing.Load()
				a, err := cl.CreateAllocation(c.ctx, oneGPU(), key)
				o := createOutcome{key: key, err: err, crashed: began != 0 || crashing.Load() != 0}
				if err == nil {
					o.id = a.ID
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
			}
		}()
	}
	// A raw reader records the HTTP answers themselves (status, code, Retry-After).
	unavailable := make(chan http.Header, 1000)
	rawDone := make(chan struct{})
	go func() {
		defer close(rawDone)
		hc := rawClient(t, c)
		tick := time.NewTicker(20 * time.Millisecond) // pacing the load, not a timing assertion
		defer tick.Stop()
		for ; !stop.Load(); <-tick.C {
			req, _ := http.NewRequestWithContext(c.ctx, "GET", c.A.Server+"/api/v1/allocations", nil)
			req.Header.Set("Authorization", "Bearer "+c.A.Token)
			resp, err := hc.Do(req)
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				unavailable <- resp.Header
			} else if resp.StatusCode != http.StatusOK {
				unavailable <- http.Header{"Unexpected-Status": {resp.Status}}
			}
		}
	}()

	// A clean restart (fast shutdown: backends send FATAL and close), then a crash (every
	// process SIGKILLed: connections die mid-statement; crash recovery on the next start).
	dir := filepath.Join(c.dir, "pg")
	for _, restart := range []struct {
		name string
		stop func() error
	}{
		{"fast shutdown", func() error { return c.A.PG.Stop() }},
		{"crash (every PostgreSQL process SIGKILLed)", func() error {
			crashing.Store(1)
			if n := killAll(filepath.Join(dir, "data")); n < 2 {
				return fmt.Errorf("killed %d PostgreSQL processes; expected the postmaster and its backends", n)
			}
			_ = c.A.PG.Stop() // releases the cluster; pg_ctl finds no postmaster to stop
			return nil
		}},
	} {
		before := seq.Load()
		waitFor(t, "load to be under way", 60*time.Second, func() (bool, error) { return seq.Load() >= before+10, nil })
		if err := restart.stop(); err != nil {
			t.Fatalf("%s: %v", restart.name, err)
		}
		mid := seq.Load()
		pg, err := pgserver.Start(c.ctx, pgserver.Options{Dir: dir})
		if err != nil {
			t.Fatalf("start PostgreSQL after %s: %v", restart.name, err)
		}
		c.A.PG = pg
		waitFor(t, "creates to go on after "+restart.name, 90*time.Second, func() (bool, error) { return seq.Load() >= mid+15, nil })
	}
	stop.Store(true)
	wg.Wait()
	<-rawDone
	close(unavailable)

	if c.A.PID() != pid {
		t.Fatal("the controller was restarted; it must recover on its own")
	}
	var n503 int
	for h := range unavailable {
		if s := h.Get("Unexpected-Status"); s != "" {
			t.Fatalf("a read during the restart answered %s, want 200 or 503", s)
		}
		if h.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
		n503++
	}
	var ok, failed []createOutcome
	for _, o := range outcomes {
		var ae *apiv1.Error
		switch {
		case o.err == nil:
			ok = append(ok, o)
		case errors.As(o.err, &ae) && ae.Code == apiv1.CodeUnavailable:
			failed = append(failed, o)
		default:
			t.Fatalf("create %s failed with %v; want success or a retryable unavailable", o.key, o.err)
		}
	}
	t.Logf("%d creates: %d succeeded, %d failed retryably; %d raw reads answered 503", len(outcomes), len(ok), len(failed), n503)
	for _, o := range ok {
		if n, err := c.A.Int(c.ctx, `SELECT count(*) FROM allocations WHERE id = $1`, o.id); err != nil || n != 1 {
			t.Fatalf("created %s (key %s) is missing: %d %v", o.id, o.key, n, err)
		}
	}
	var ambiguous int
	for _, o := range failed {
		var existing string
		err := c.A.DB.QueryRow(c.ctx, `SELECT coalesce((SELECT id::text FROM allocations WHERE idempotency_key = $1), '')`, o.key).Scan(&existing)
		if err != nil {
			t.Fatal(err)
		}
		if existing != "" && !o.crashed {
			t.Fatalf("create %s failed (%v) but allocation %s exists: applied yet reported failed", o.key, o.err, existing)
		}
		if existing != "" {
			// A crash can destroy the answer to a COMMIT that reached the disk: the client
			// cannot know (no system can tell it). The allocation is whole (invariants below)
			// and the same key settles it.
			ambiguous++
		}
		a, err := c.tenant(c.A.Server).CreateAllocation(c.ctx, oneGPU(), o.key)
		if err != nil {
			t.Fatalf("retry of %s after the restart: %v", o.key, err)
		}
		if existing != "" && a.ID != existing {
			t.Fatalf("retry of %s returned %s, not the allocation its lost commit made (%s)", o.key, a.ID, existing)
		}
		if n, _ := c.A.Int(c.ctx, `SELECT count(*) FROM allocations WHERE idempotency_key = $1`, o.key); n != 1 || a.ID == "" {
			t.Fatalf("retry of %s: %d allocations", o.key, n)
		}
	}
	t.Logf("%d failed creates had committed before the crash took their answer; their retries returned them", ambiguous)
	c.checkInvariants()
	if lines := internalErrors(t, c.dir); len(lines) > 0 {
		t.Fatalf("the controller answered %d internal errors during the restarts:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}

// rawClient is an HTTPS client trusting the controller's CA, for checks on raw answers.
func rawClient(t *testing.T, c *cluster) *http.Client {
	t.Helper()
	cfg, err := pki.ClientTLSConfig(c.A.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// killAll SIGKILLs every process working in dataDir (a PostgreSQL cluster's postmaster and
// backends: a crash, nothing flushed, no FATAL sent to clients) and returns how many.
func killAll(dataDir string) int {
	dataDir, _ = filepath.EvalSymlinks(dataDir)
	links, _ := filepath.Glob("/proc/[0-9]*/cwd")
	n := 0
	for _, l := range links {
		if cwd, err := os.Readlink(l); err == nil && cwd == dataDir {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(l))); err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}
