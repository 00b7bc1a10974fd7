// Package fanout measures dispatch fan-out: thousands of simulated hosts,
// each on its own TLS connection with its own mTLS node certificate, long-poll one real
// controller the way hostd does; tasks are committed at a fixed rate to random hosts by
// another process and woken through PostgreSQL NOTIFY (the cross-replica path), and the
// commit-to-receipt latency and the controller's memory per parked poll are recorded.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Options configures Run.
type Options struct {
	Hosts    int           // simulated hosts, one long poll each
	Rate     int           // tasks committed per second
	Duration time.Duration // length of the task stream
	Wait     time.Duration // long-poll wait each host asks for (hostd's default: 30s)
	Dial     int           // hosts connecting at once (TLS handshakes in flight)
}

func (o *Options) defaults() {
	if o.Wait == 0 {
		o.Wait = 30 * time.Second
	}
	if o.Dial == 0 {
		o.Dial = 64
	}
}

// Result is one run. Latencies are commit-to-receipt: from COMMIT returning in the bench
// process to the host's HTTP response being decoded in the same process.
type Result struct {
	Hosts          int      `json:"hosts"`
	Rate           int      `json:"tasks_per_sec"`
	Tasks          int      `json:"tasks"`
	StreamSeconds  float64  `json:"stream_seconds"`
	P50ms          float64  `json:"p50_ms"`
	P90ms          float64  `json:"p90_ms"`
	P99ms          float64  `json:"p99_ms"`
	MaxMs          float64  `json:"max_ms"`
	NotifyP50ms    float64  `json:"notify_p50_ms"` // commit to pg_notify returning
	CommitP50ms    float64  `json:"commit_p50_ms"` // the insert transaction, begin to commit
	Lost           int      `json:"lost"`          // committed, never received
	Duplicates     int      `json:"duplicates"`    // received more than once
	Unexpected     int      `json:"unexpected"`    // received, never committed by this run
	Refused        int      `json:"refused"`       // envelopes failing hostd's verification
	PollErrors     int      `json:"poll_errors"`   // transport errors and non-200/204 answers
	FirstError     string   `json:"first_error,omitempty"`
	ConnectSeconds float64  `json:"connect_seconds"` // first handshake to the last host's poll sent
	SettleSeconds  float64  `json:"settle_seconds"`  // then until the controller went quiet
	RSSBeforeMiB   float64  `json:"rss_before_mib"`
	RSSAfterMiB    float64  `json:"rss_after_mib"`
	BytesPerHost   float64  `json:"rss_bytes_per_host"`
	HeapBeforeMiB  float64  `json:"heap_before_mib"` // heap in use + goroutine stacks, after a GC
	HeapAfterMiB   float64  `json:"heap_after_mib"`
	HeapPerHost    float64  `json:"heap_bytes_per_host"`
	Goroutines     int      `json:"controller_goroutines"` // with every poll parked
	ControllerCPU  float64  `json:"controller_cpu"`        // CPUs the controller used during the stream
	Load1          float64  `json:"load1"`                 // the machine's 1-minute load average at the stream's end
	Series         []Second `json:"series"`
}

// RaiseFileLimit lifts this process's open-file soft limit to the hard limit; call it before
// benchenv.Start so the controller, a child, inherits it (10,000 hosts are 10,000 sockets on
// each side).
func RaiseFileLimit() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	l.Cur = l.Max
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
}

// Run seeds o.Hosts nodes with recorded certificates, connects every host, measures the
// controller's memory with all polls parked, then streams tasks for o.Duration.
func Run(ctx context.Context, env *benchenv.Env, o Options) (Result, error) {
	o.defaults()
	res := Result{Hosts: o.Hosts, Rate: o.Rate}
	if err := RaiseFileLimit(); err != nil {
		return res, err
	}
	ids, err := createNodes(ctx, env.Store, o.Hosts)
	if err != nil {
		return res, fmt.Errorf("nodes: %w", err)
	}
	ca, err := pki.LoadCA(env.StateDir)
	if err != nil {
		return res, err
	}
	idents, err := issueIdentities(ca, ids, time.Now())
	if err != nil {
		return res, err
	}
	err = env.Store.InTx(ctx, func(tx *store.Tx) error {
		for _, id := range idents {
			if err := tx.RecordCredential(ctx, id.serial, id.nodeID, id.notAfter); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("credentials: %w", err)
	}
	signPub, err := pki.LoadSigningPub(pki.Paths{Dir: env.StateDir}.SigningPub())
	if err != nil {
		return res, err
	}
	ctl := proc{pid: env.PID(), env: env} // heap figures need benchenv.Options.Pprof
	if _, err := ctl.quiet(ctx, 0.05, 30*time.Second); err != nil {
		return res, err
	}
	before, err := ctl.memory(ctx)
	if err != nil {
		return res, err
	}

	l := newLedger()
	var running sync.WaitGroup
	defer running.Wait()
	hctx, stopHosts := context.WithCancel(ctx)
	defer stopHosts() // runs before running.Wait (last in, first out)
	var sent sync.WaitGroup
	dial := make(chan struct{}, o.Dial)
	connectStart := time.Now()
	for _, id := range idents {
		h, err := newHost(id, env.Server, env.CAFile, o.Wait, &task.Verifier{Key: signPub, NodeID: id.nodeID, Skew: time.Minute}, l)
		if err != nil {
			return res, err
		}
		select {
		case dial <- struct{}{}:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		sent.Add(1)
		running.Add(1)
		go func() {
			defer running.Done()
			h.run(hctx, func() { <-dial; sent.Done() })
		}()
	}
	if err := waitGroup(ctx, &sent, 3*time.Minute); err != nil {
		return res, fmt.Errorf("hosts connecting: %w", err)
	}
	res.ConnectSeconds = time.Since(connectStart).Seconds()
	// Every poll is on the wire; the controller still authenticates and parks the last ones.
	// A quiet controller is the outside sign that it is done (re-polls of the first hosts
	// keep some CPU busy on large fleets, hence the tolerance).
	settled, err := ctl.quiet(ctx, 0.15, 30*time.Second)
	if err != nil {
		return res, err
	}
	res.SettleSeconds = settled.Seconds()
	after, err := ctl.memory(ctx)
	if err != nil {
		return res, err
	}
	res.RSSBeforeMiB, res.RSSAfterMiB = mib(before.rss), mib(after.rss)
	res.BytesPerHost = float64(after.rss-before.rss) / float64(o.Hosts)
	res.HeapBeforeMiB, res.HeapAfterMiB = mib(before.heap), mib(after.heap)
	res.HeapPerHost = float64(after.heap-before.heap) / float64(o.Hosts)
	res.Goroutines = after.goroutines

	streamStart := time.Now()
	cpu0, err := ctl.cpu()
	if err != nil {
		return res, err
	}
	commits, notifies, err := stream(ctx, env.Store, ids, o.Rate, o.Duration, l)
	if err != nil {
		return res, err
	}
	res.StreamSeconds = time.Since(streamStart).Seconds()
	cpu1, err := ctl.cpu()
	if err != nil {
		return res, err
	}
	res.ControllerCPU = (cpu1 - cpu0).Seconds() / res.StreamSeconds
	res.Load1 = loadAverage()
	// Receipts still in flight get a few seconds; a task missing after that is lost.
	deadline := time.Now().Add(10 * time.Second)
	for l.outstanding() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	stopHosts()
	running.Wait()
	s := l.summary(streamStart, int(o.Duration/time.Second))
	res.Series = s.series
	res.Tasks = s.committed
	res.Lost, res.Duplicates, res.Unexpected = s.lost, s.duplicates, s.unexpected
	res.P50ms, res.P90ms, res.P99ms = benchenv.Percentile(s.latencies, 50), benchenv.Percentile(s.latencies, 90), benchenv.Percentile(s.latencies, 99)
	res.MaxMs = benchenv.Percentile(s.latencies, 100)
	res.CommitP50ms, res.NotifyP50ms = benchenv.Percentile(commits, 50), benchenv.Percentile(notifies, 50)
	res.Refused, res.PollErrors, res.FirstError = l.refused, l.pollErrors, l.firstError
	return res, nil
}

// createNodes registers n bare nodes (no slots: dispatch does not look at them).
func createNodes(ctx context.Context, st *store.Store, n int) ([]string, error) {
	ids := make([]string, 0, n)
	for len(ids) < n {
		base, batch := len(ids), min(1000, n-len(ids))
		var got []string
		err := st.InTx(ctx, func(tx *store.Tx) error {
			got = got[:0]
			for k := 0; k < batch; k++ {
				nd, err := tx.CreateNode(ctx, apiv1.NodeCreate{Name: fmt.Sprintf("fanout-%05d", base+k), Region: "bench"})
				if err != nil {
					return err
				}
				got = append(got, nd.ID)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		ids = append(ids, got...)
	}
	return ids, nil
}

// stream commits rate tasks a second for d, each to a random host, open loop: a slow commit
// delays no other. Each task is one transaction, then the NOTIFY a second controller replica
// would send after its commit. It returns the commit and commit-to-notify durations.
func stream(ctx context.Context, st *store.Store, ids []string, rate int, d time.Duration, l *ledger) (commits, notifies []time.Duration, err error) {
	n := int(float64(rate) * d.Seconds())
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	start := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); wait > 0 {
			time.Sleep(wait)
		}
		node := ids[rand.IntN(len(ids))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var id string
			t0 := time.Now()
			err := st.InTx(ctx, func(tx *store.Tx) error {
				var err error
				id, err = tx.InsertTask(ctx, store.NewTask{NodeID: node, Type: string(task.TypeReconcile), Payload: task.Reconcile{}, TTL: time.Hour})
				return err
			})
			committed := time.Now()
			if err == nil {
				l.commit(id, committed)
				err = st.Notify(ctx, dispatch.NotifyChannel, node)
			}
			notified := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			commits = append(commits, committed.Sub(t0))
			notifies = append(notifies, notified.Sub(committed))
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return commits, notifies, firstErr
}

// waitGroup waits for wg, ctx or the timeout.
func waitGroup(ctx context.Context, wg *sync.WaitGroup, timeout time.Duration) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return errors.New("timed out")
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
