package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// pgPair is a PostgreSQL primary and its streaming standby (pg_basebackup), each on its own
// Unix socket, and the multi-host URL controllers use to follow whichever accepts writes.
type pgPair struct {
	primaryDir, standbyDir string
	primary, standby       *pgserver.Server
	url                    string
}

// replicationSettings are a server's replication settings: on the primary, a commit waits
// until the standby has flushed its WAL (sync) or only for the local flush (async); the
// standby gets the async ones (it must run alone once promoted).
func replicationSettings(sync bool) []string {
	set := []string{"wal_level=replica", "max_wal_senders=4", "wal_keep_size=256MB", "synchronous_commit=on"}
	// A standby whose primary went away retries streaming after this (default 5 s), and
	// pg_ctl promote waits for that retry: it is most of the failover window otherwise.
	set = append(set, "wal_retrieve_retry_interval=200ms")
	if sync {
		return append(set, "synchronous_standby_names="+pgserver.StandbyName)
	}
	return append(set, "synchronous_standby_names=")
}

// startPair starts the primary, copies it into a standby and waits until the standby streams
// (in sync mode: until the primary counts it as its synchronous standby). The standby runs
// without synchronous_standby_names: once promoted it is alone, and a primary waiting for a
// standby that is not there would accept no write (a failover manager clears it the same way).
func startPair(t *testing.T, ctx context.Context, dir string, sync bool) *pgPair {
	t.Helper()
	p := &pgPair{primaryDir: filepath.Join(dir, "pg-a"), standbyDir: filepath.Join(dir, "pg-b")}
	var err error
	if p.primary, err = pgserver.Start(ctx, pgserver.Options{Dir: p.primaryDir, Settings: replicationSettings(sync)}); err != nil {
		t.Fatalf("start the primary: %v", err)
	}
	t.Cleanup(func() { _ = p.primary.Stop() })
	if p.standby, err = pgserver.Start(ctx, pgserver.Options{Dir: p.standbyDir, StandbyOf: p.primary,
		Settings: replicationSettings(false)}); err != nil {
		t.Fatalf("start the standby: %v", err)
	}
	t.Cleanup(func() { _ = p.standby.Stop() })
	p.url = fmt.Sprintf("postgres://%s@/postgres?host=%s,%s&sslmode=disable&target_session_attrs=read-write",
		pgserver.Superuser, p.primary.SocketDir(), p.standby.SocketDir())
	want := "async"
	if sync {
		want = "sync"
	}
	waitFor(t, "the standby to stream ("+want+")", 60*time.Second, func() (bool, error) {
		var state string
		err := queryOne(ctx, p.primary.ConnString("postgres"), `SELECT coalesce((SELECT sync_state FROM pg_stat_replication
			WHERE application_name = $1 AND state = 'streaming'), '')`, &state, pgserver.StandbyName)
		return state == want, err
	})
	return p
}

// newFailoverCluster starts a pgPair and two controller replicas on its multi-host URL;
// hosts are added with addHost.
func newFailoverCluster(t *testing.T, sync bool, flags ...string) (*cluster, *pgPair) {
	t.Helper()
	pgtest.RequireServer(t)
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := filepath.Join(workRoot, fmt.Sprintf("%s-%d", t.Name(), dirSeq.Add(1)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pair := startPair(t, ctx, dir, sync)
	c := &cluster{t: t, ctx: ctx, dir: dir, flags: flags}
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: dir, BinDir: binDir, DatabaseURL: pair.url, ExtraFlags: flags})
	if err != nil {
		t.Fatalf("start replica A: %v", err)
	}
	c.A = env
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, dir)
		}
		env.Stop()
	})
	if c.B, err = env.Replica(ctx, binDir, filepath.Join(dir, "b"), flags...); err != nil {
		t.Fatalf("start replica B: %v", err)
	}
	t.Cleanup(c.B.Stop)
	tok, err := os.ReadFile(pki.Paths{Dir: env.StateDir}.AdminToken())
	if err != nil {
		t.Fatal(err)
	}
	if c.admin, err = client.New(client.Options{Server: env.Server + "," + c.B.Server, CAFile: env.CAFile,
		Token: strings.TrimSpace(string(tok))}); err != nil {
		t.Fatal(err)
	}
	return c, pair
}

// queryOne runs a one-value query on its own connection (the harness's pools follow the
// multi-host URL; this reads one server).
func queryOne(ctx context.Context, connString, sql string, dst any, args ...any) error {
	st, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	defer st.Close(context.WithoutCancel(ctx))
	return st.QueryRow(ctx, sql, args...).Scan(dst)
}

// sqlText matches phrases only PostgreSQL's and pgx's own messages carry (the api package's
// check, and the connection errors of a failover: hosts, sockets, "read only connection").
var sqlText = regexp.MustCompile(`violates (unique|foreign key|check|not-null|exclusion) constraint|duplicate key value|` +
	`invalid input syntax for|SQLSTATE|relation \\?"[a-z_]+\\?"|column \\?"[a-z_]+\\?"|for type uuid|_fkey\\?"|_pkey\\?"|_key\\?"|pgx: |pq: |` +
	`failed to connect|read.only|ValidateConnect|dial unix|connection refused|\\.s\\.PGSQL`)

// ack is one answer a client got a success for.
type ack struct {
	id, key, op string // op: create or release
	via         string // A or B
	at          time.Time
}

// loadFailure is one failed call: on which allocation, what the client saw, how long it took.
type loadFailure struct {
	op, id string
	err    error
	took   time.Duration
}

// ledger is the load generator's own record of acknowledged creates and releases.
type ledger struct {
	mu       sync.Mutex
	acks     []ack
	failures []loadFailure
	taken    map[string]time.Time // when the owner first read the allocation taken by its host
}

// take records when allocation id was first seen taken by its host (provisioning or on).
func (l *ledger) take(id string) {
	l.mu.Lock()
	if _, ok := l.taken[id]; !ok {
		l.taken[id] = time.Now()
	}
	l.mu.Unlock()
}

// firstTakenVia is the first create acknowledged through replica via after t that its host
// took, and when it was taken.
func (l *ledger) firstTakenVia(via string, t time.Time) (ack, time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.acks { // in acknowledgement order
		if a.op == "create" && a.via == via && a.at.After(t) {
			if at, ok := l.taken[a.id]; ok {
				return a, at, true
			}
		}
	}
	return ack{}, time.Time{}, false
}

func (l *ledger) ack(a ack) {
	l.mu.Lock()
	l.acks = append(l.acks, a)
	l.mu.Unlock()
}

func (l *ledger) fail(op, id string, err error, took time.Duration) {
	l.mu.Lock()
	l.failures = append(l.failures, loadFailure{op: op, id: id, err: err, took: took})
	l.mu.Unlock()
}

func (l *ledger) count(op string, after time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.acks {
		if a.op == op && a.at.After(after) {
			n++
		}
	}
	return n
}

// window is the last success before t and the first success after it.
func (l *ledger) window(t time.Time) (last, first time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.acks {
		if a.at.Before(t) && a.at.After(last) {
			last = a.at
		}
		if a.at.After(t) && (first.IsZero() || a.at.Before(first)) {
			first = a.at
		}
	}
	return last, first
}

// requestTimeout bounds every client call: a call that runs past it is a hang.
const requestTimeout = 15 * time.Second

// retryable is what a tenant retries: the failover's 503 unavailable, and for a create the
// capacity refusal (every slot held or being wiped while releases queue up in the gap).
func retryable(op string, err error) bool {
	var ae *apiv1.Error
	return errors.As(err, &ae) && (ae.Code == apiv1.CodeUnavailable || op == "create" && ae.Code == apiv1.CodeSKUUnavailable)
}

// loadClient creates a one-GPU allocation, waits until it is active, releases it, and again,
// until stop; a cycle under way when stop is set is finished (its allocation released).
// A retryable failure is retried (a create with the same idempotency key), as a tenant
// would; any other answer ends the cycle. Every failure is recorded.
func loadClient(c *cluster, l *ledger, cl *client.Client, via string, n int, stop *atomic.Bool) {
	call := func(op, id string, fn func(ctx context.Context) error) error {
		for {
			ctx, cancel := context.WithTimeout(c.ctx, requestTimeout)
			began := time.Now()
			err := fn(ctx)
			cancel()
			if err == nil || c.ctx.Err() != nil {
				return err
			}
			l.fail(op, id, err, time.Since(began))
			if !retryable(op, err) {
				return err
			}
			pause(c.ctx, 200*time.Millisecond)
		}
	}
	for i := 0; !stop.Load() && c.ctx.Err() == nil; i++ {
		key := fmt.Sprintf("%s-%d-%d", via, n, i)
		var id string
		if call("create", "", func(ctx context.Context) error {
			a, err := cl.CreateAllocation(ctx, oneGPU(), key)
			if err == nil {
				id = a.ID
				l.ack(ack{id: a.ID, key: key, op: "create", via: via, at: time.Now()})
			}
			return err
		}) != nil {
			continue
		}
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) && c.ctx.Err() == nil {
			var a *apiv1.Allocation
			err := call("get", id, func(ctx context.Context) (err error) {
				a, err = cl.GetAllocation(ctx, id)
				return err
			})
			if err == nil && a.Status != "requested" {
				l.take(id)
			}
			if err != nil || a.Status == "active" {
				break
			}
			if a.Status == "failed" {
				id = "" // the controller cleans a failed allocation up itself (as the soak's clients, none is released)
				break
			}
			pause(c.ctx, 100*time.Millisecond)
		}
		if id == "" {
			continue
		}
		_ = call("release", id, func(ctx context.Context) error {
			_, err := cl.ReleaseAllocation(ctx, id)
			if err == nil {
				l.ack(ack{id: id, key: key, op: "release", via: via, at: time.Now()})
			}
			return err
		})
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// readyProbe polls both replicas' /readyz, and a tenant's allocation list on each without
// the client library's retries (the raw answers: status, Retry-After, body), and records
// every answer with its time.
type readyProbe struct {
	mu      sync.Mutex
	answers map[string][]probeAnswer // by replica
	reads   []probeAnswer            // GET /api/v1/allocations on either replica
}

type probeAnswer struct {
	at         time.Time
	status     int // 0: no answer
	retryAfter string
	body       string
}

func (p *readyProbe) run(ctx context.Context, t *testing.T, c *cluster) {
	hc := rawClient(t, c)
	get := func(url, token string) probeAnswer {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		a := probeAnswer{}
		if resp, err := hc.Do(req); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			a.status, a.retryAfter, a.body = resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
		}
		a.at = time.Now()
		return a
	}
	tick := time.NewTicker(25 * time.Millisecond) // probe pacing, not a timing assertion
	defer tick.Stop()
	for ; ctx.Err() == nil; <-tick.C {
		for name, srv := range map[string]string{"A": c.A.Server, "B": c.B.Server} {
			ready, read := get(srv+"/readyz", ""), get(srv+"/api/v1/allocations?status=active", c.A.Token)
			p.mu.Lock()
			p.answers[name] = append(p.answers[name], ready)
			if ctx.Err() == nil {
				p.reads = append(p.reads, read)
			}
			p.mu.Unlock()
		}
	}
}

// checkReads holds the raw reads to 200, or 503 "unavailable" with Retry-After in our words,
// and returns how many 503s there were.
func (p *readyProbe) checkReads(t *testing.T) (unavailable int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.reads {
		switch a.status {
		case http.StatusOK:
		case http.StatusServiceUnavailable:
			var e apiv1.Error
			if err := json.Unmarshal([]byte(a.body), &e); err != nil || e.Code != apiv1.CodeUnavailable || a.retryAfter == "" {
				t.Fatalf("a read answered 503 %q (Retry-After %q); want code unavailable with Retry-After", a.body, a.retryAfter)
			}
			if sqlText.MatchString(a.body) {
				t.Fatalf("a read's 503 carries database text: %s", a.body)
			}
			unavailable++
		default:
			t.Fatalf("a read during the failover answered %d %s; want 200 or 503", a.status, a.body)
		}
	}
	return unavailable
}

// last is replica name's latest answer.
func (p *readyProbe) last(name string) probeAnswer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a := p.answers[name]; len(a) > 0 {
		return a[len(a)-1]
	}
	return probeAnswer{}
}

// since is every answer of replica name at or after t.
func (p *readyProbe) since(name string, t time.Time) []probeAnswer {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []probeAnswer
	for _, a := range p.answers[name] {
		if !a.at.Before(t) {
			out = append(out, a)
		}
	}
	return out
}

// failoverRun is what one failover under load measured.
type failoverRun struct {
	kill, promoted   time.Time
	gone             time.Time // both replicas said /readyz 503
	lastOK, firstOK  time.Time
	readyBackA       time.Time
	readyBackB       time.Time
	acks             []ack
	failures         []loadFailure
	creates, release int
	reads503         int // raw reads answered 503 unavailable
	// The first allocation created through B after the promotion: from its create's answer,
	// and from the promotion, until its owner read it taken by its host (polled every 100 ms).
	wakeAfterCreate, wakeAfterPromotion time.Duration
}

func (r failoverRun) unavailable() time.Duration { return r.firstOK.Sub(r.lastOK) }

// failoverUnderLoad runs 16 clients (8 through each replica) against hosts parked on A,
// kills the primary with SIGKILL once the load is under way, waits until both replicas
// say /readyz 503, promotes the standby, lets the load go on until both say 200 and 20 more
// creates succeeded, then stops the clients (each finishes its cycle) and returns the ledger.
//
// beforeKill (may be nil) runs once the load is under way, just before the kill.
func failoverUnderLoad(t *testing.T, c *cluster, pair *pgPair, beforeKill func(l *ledger)) failoverRun {
	t.Helper()
	l := &ledger{taken: map[string]time.Time{}}
	probe := &readyProbe{answers: map[string][]probeAnswer{}}
	probeCtx, stopProbe := context.WithCancel(c.ctx)
	probeDone := make(chan struct{})
	go func() { defer close(probeDone); probe.run(probeCtx, t, c) }()
	defer stopProbe()

	var stop atomic.Bool
	var wg sync.WaitGroup
	for n := 0; n < 16; n++ {
		via, srv := "A", c.A.Server
		if n%2 == 1 {
			via, srv = "B", c.B.Server
		}
		cl := c.tenant(srv)
		wg.Add(1)
		go func() { defer wg.Done(); loadClient(c, l, cl, via, n, &stop) }()
	}
	var r failoverRun
	start := time.Now()
	t.Logf("load: 16 clients (8 through each replica) on %d hosts", c.hosts)
	waitFor(t, "the load to be under way", 2*time.Minute, func() (bool, error) {
		return l.count("create", start) >= 24 && l.count("release", start) >= 12, nil
	})
	if beforeKill != nil {
		beforeKill(l)
	}
	r.kill = time.Now()
	n, err := pair.primary.Kill()
	if err != nil {
		t.Fatalf("kill -9 the primary: %v", err)
	}
	t.Logf("kill -9 of the primary: %d PostgreSQL processes", n)
	for _, name := range []string{"A", "B"} {
		waitFor(t, "replica "+name+" to say /readyz 503 while no server accepts writes", 30*time.Second, func() (bool, error) {
			a := probe.last(name)
			return a.at.After(r.kill) && a.status == http.StatusServiceUnavailable, nil
		})
	}
	r.gone = time.Now()
	if err := pair.standby.Promote(c.ctx); err != nil {
		t.Fatal(err)
	}
	r.promoted = time.Now()
	t.Logf("both replicas said /readyz 503 %s after the kill; pg_ctl promote -w took %s", r.gone.Sub(r.kill).Round(time.Millisecond),
		r.promoted.Sub(r.gone).Round(time.Millisecond))
	for _, name := range []string{"A", "B"} {
		waitFor(t, "replica "+name+" to say /readyz 200 on the promoted standby", 60*time.Second, func() (bool, error) {
			a := probe.last(name)
			return a.at.After(r.promoted) && a.status == http.StatusOK, nil
		})
		for _, a := range probe.since(name, r.promoted) {
			if a.status == http.StatusOK {
				if name == "A" {
					r.readyBackA = a.at
				} else {
					r.readyBackB = a.at
				}
				break
			}
		}
	}
	waitFor(t, "20 creates after the promotion", 2*time.Minute, func() (bool, error) {
		return l.count("create", r.promoted) >= 20, nil
	})
	// Wake-ups on the new primary: the first allocation created through B after the
	// promotion reaches a host long-polling A only through B's NOTIFY and A's LISTEN.
	waitFor(t, "an allocation created through B after the promotion to reach its host", time.Minute, func() (bool, error) {
		var ok bool
		_, _, ok = l.firstTakenVia("B", r.promoted)
		return ok, nil
	})
	stop.Store(true)
	wg.Wait()
	a, taken, _ := l.firstTakenVia("B", r.promoted)
	r.wakeAfterCreate, r.wakeAfterPromotion = taken.Sub(a.at), taken.Sub(r.promoted)
	// A success answered just after the kill was committed before it: the window runs from
	// the last answer before the kill to the first one after the promotion.
	r.lastOK, _ = l.window(r.kill)
	_, r.firstOK = l.window(r.promoted)
	for _, name := range []string{"A", "B"} {
		for _, a := range probe.since(name, start) {
			if a.status != http.StatusOK && a.status != http.StatusServiceUnavailable {
				t.Fatalf("replica %s answered /readyz %d at %s; want 200 or 503", name, a.status, a.at.Format(time.StampMilli))
			}
		}
	}
	stopProbe()
	<-probeDone
	if r.reads503 = probe.checkReads(t); r.reads503 == 0 {
		t.Fatal("no read answered 503 while no server accepted writes")
	}
	l.mu.Lock()
	r.acks, r.failures = l.acks, l.failures
	l.mu.Unlock()
	for _, a := range r.acks {
		if a.op == "create" {
			r.creates++
		} else {
			r.release++
		}
	}
	return r
}

// checkFailures holds every failed call to what a tenant may see during a failover: a
// retryable 503 "unavailable" in our words, answered within the request timeout.
//
// lost are allocations whose acknowledged create the database lost (asynchronous
// replication): their owner's reads and release answer not_found, which is what the
// database now says.
func checkFailures(t *testing.T, fs []loadFailure, lost map[string]bool) map[string]int {
	t.Helper()
	byKind := map[string]int{}
	for _, f := range fs {
		var ae *apiv1.Error
		if !errors.As(f.err, &ae) {
			t.Fatalf("%s failed with %v after %s; want a retryable unavailable answer", f.op, f.err, f.took.Round(time.Millisecond))
		}
		if ae.Code == apiv1.CodeNotFound && lost[f.id] {
			byKind[f.op+":not_found(lost)"]++
			continue
		}
		if ae.Code == apiv1.CodeSKUUnavailable && f.op == "create" {
			// Every slot held or still being wiped (releases queue up during the gap): a
			// capacity answer, not a failover one.
			byKind[f.op+":"+ae.Code]++
			continue
		}
		if ae.Code != apiv1.CodeUnavailable {
			t.Fatalf("%s failed with %s %q; want the retryable unavailable", f.op, ae.Code, ae.Message)
		}
		if sqlText.MatchString(ae.Message) || sqlText.MatchString(fmt.Sprint(ae.Details)) {
			t.Fatalf("%s: a client saw database text: %q %v", f.op, ae.Message, ae.Details)
		}
		if f.took >= requestTimeout {
			t.Fatalf("%s hung for %s (timeout %s)", f.op, f.took, requestTimeout)
		}
		byKind[f.op+":"+ae.Code]++
	}
	return byKind
}

// settleAll waits until every allocation has come to rest (released or failed) and every
// host has delivered every result it spooled.
func settleAll(t *testing.T, c *cluster, hosts []*host) {
	t.Helper()
	waitFor(t, "every allocation to come to rest", 3*time.Minute, func() (bool, error) {
		n, err := c.A.Int(c.ctx, `SELECT count(*) FROM allocations WHERE status NOT IN ('released', 'failed')`)
		return err == nil && n == 0, err
	})
	for _, h := range hosts {
		waitFor(t, h.name+"'s spool to drain", time.Minute, func() (bool, error) { return h.spooled() == 0, nil })
	}
}

// checkLedger holds the new primary to every acknowledged create and release: the
// allocation is there with its claims and the audit row of each acknowledged action, and it
// was released. It returns the acknowledged creates the database does not have (asserted
// none by the synchronous test; counted by the asynchronous one).
func checkLedger(t *testing.T, c *cluster, acks []ack, mustHave bool) (missing []ack) {
	t.Helper()
	for _, a := range acks {
		var status string
		var claims, audits int
		err := c.A.DB.QueryRow(c.ctx, `SELECT a.status,
				(SELECT count(*) FROM allocation_resource_claims WHERE allocation_id = a.id),
				(SELECT count(*) FROM audit_log WHERE target_id = a.id::text AND action = 'allocation.' || $2)
			FROM allocations a WHERE a.id = $1`, a.id, a.op).Scan(&status, &claims, &audits)
		if err != nil {
			if mustHave {
				t.Fatalf("acknowledged %s of %s (key %s, through %s at %s) is not on the new primary: %v",
					a.op, a.id, a.key, a.via, a.at.Format(time.StampMilli), err)
			}
			if a.op == "create" {
				missing = append(missing, a)
			}
			continue
		}
		if claims == 0 || audits == 0 {
			t.Fatalf("acknowledged %s of %s: %d claims, %d audit rows on the new primary; want both", a.op, a.id, claims, audits)
		}
		if a.op == "release" && status != "released" {
			t.Fatalf("acknowledged release of %s: the allocation is %s", a.id, status)
		}
	}
	return missing
}

// checkHosts holds every host to its tasks: each task it started ran once, every task the
// database gave a host finished (nothing pending, no result lost).
func checkHosts(t *testing.T, c *cluster, hosts []*host) int {
	t.Helper()
	started := 0
	for _, h := range hosts {
		for id, n := range h.runs() {
			started++
			if n != 1 {
				t.Fatalf("%s started task %s %d times; want once", h.name, id, n)
			}
		}
	}
	var open []string
	rows, err := c.A.DB.Query(c.ctx, `SELECT id::text || ' ' || type || ' ' || status FROM node_tasks
		WHERE status IN ('queued', 'leased')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		open = append(open, s)
	}
	rows.Close()
	if len(open) > 0 {
		t.Fatalf("tasks left undelivered or unfinished after the failover: %v", open)
	}
	return started
}

// wakeup creates an allocation through B while every host long-polls A with nothing to do,
// and returns how long until a host had taken it: B's NOTIFY through the new primary must
// wake A's parked poll (without it the host would wait most of a minute).
func wakeup(t *testing.T, c *cluster) time.Duration {
	t.Helper()
	viaA, viaB := c.tenant(c.A.Server), c.tenant(c.B.Server)
	a, err := viaB.CreateAllocation(c.ctx, oneGPU(), "")
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	allocStatus(t, viaA, a.ID, 60*time.Second, "provisioning", "active")
	took := time.Since(created)
	allocStatus(t, viaA, a.ID, 60*time.Second, "active")
	if _, err := viaA.ReleaseAllocation(c.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	allocStatus(t, viaA, a.ID, 60*time.Second, "released")
	return took
}

func sortedKinds(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}
