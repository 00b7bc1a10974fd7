package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/task"
)

// fakeController serves the agent endpoints over mTLS with the real PKI; handlers are set
// per test. It stands in for the controller only to make it fail on purpose.
type fakeController struct {
	srv     *httptest.Server
	dir     string
	mu      sync.Mutex
	tasks   []*task.Envelope
	results map[string]int // task id -> accepted deliveries
	last    map[string]task.Result
	// redeliver, when set, offers a handed-out task again once it has gone this long without
	// a result, as the controller does when a lease ends (a poll the host abandoned on
	// shutdown may have taken it).
	redeliver time.Duration
	leased    map[string]leasedTask
	down      atomic.Bool // answer 503 to results
}

func newFake(t *testing.T) *fakeController {
	f := &fakeController{dir: t.TempDir(), results: map[string]int{}, last: map[string]task.Result{}, leased: map[string]leasedTask{}}
	if _, err := pki.Init(pki.InitOptions{Dir: f.dir}); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/agent/tasks", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for id, l := range f.leased {
			if time.Since(l.at) > f.redeliver {
				delete(f.leased, id)
				f.tasks = append(f.tasks, l.env)
			}
		}
		if len(f.tasks) == 0 {
			w.WriteHeader(204)
			return
		}
		n, err := strconv.Atoi(r.URL.Query().Get("max"))
		if err != nil || n < 1 {
			t.Errorf("hostd polled without a valid max: %q", r.URL.RawQuery)
			w.WriteHeader(400)
			return
		}
		n = min(n, len(f.tasks))
		batch := task.Batch{Tasks: f.tasks[:n]}
		f.tasks = f.tasks[n:]
		if f.redeliver > 0 {
			for _, e := range batch.Tasks {
				f.leased[e.TaskID] = leasedTask{env: e, at: time.Now()}
			}
		}
		_ = json.NewEncoder(w).Encode(batch)
	})
	mux.HandleFunc("POST /api/v1/agent/tasks/{id}/result", func(w http.ResponseWriter, r *http.Request) {
		if f.down.Load() {
			w.WriteHeader(503)
			return
		}
		var res task.Result
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &res); err != nil {
			t.Errorf("result body: %v", err)
		}
		f.mu.Lock()
		f.results[r.PathValue("id")]++
		f.last[r.PathValue("id")] = res
		delete(f.leased, r.PathValue("id"))
		f.mu.Unlock()
		w.WriteHeader(200)
		_, _ = w.Write([]byte(`{}`))
	})
	mux.HandleFunc("POST /api/v1/agent/", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	f.srv = httptest.NewUnstartedServer(mux)
	var err error
	if f.srv.TLS, err = pki.ServerTLSConfig(f.dir); err != nil {
		t.Fatal(err)
	}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

type leasedTask struct {
	env *task.Envelope
	at  time.Time
}

func (f *fakeController) delivered(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.results[id]
}

// identity writes an enrolled host's files and returns its config.
func identity(t *testing.T, f *fakeController, nodeID string) Config {
	t.Helper()
	ca, _ := pki.LoadCA(f.dir)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	certPEM, err := ca.IssueClientCert(&key.PublicKey, "node:"+nodeID, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p := pki.Paths{Dir: f.dir}
	c := Config{Server: f.srv.URL, NodeID: nodeID, CAFile: p.CACert(), CertFile: filepath.Join(dir, "hostd.crt"),
		KeyFile: filepath.Join(dir, "hostd.key"), SigningPubFile: p.SigningPub(), StateDir: filepath.Join(dir, "state"),
		Runtime: "sim", PollWait: time.Second, Heartbeat: time.Hour}
	_ = mkdirWrite(c.CertFile, certPEM)
	_ = mkdirWrite(c.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	c.defaults()
	return c
}

func (f *fakeController) queue(t *testing.T, nodeID, taskID string) {
	t.Helper()
	f.queueAt(t, nodeID, taskID, time.Now())
}

// queueAt queues a task signed as issued at issued (the controller's clock), valid 1 hour.
func (f *fakeController) queueAt(t *testing.T, nodeID, taskID string, issued time.Time) {
	t.Helper()
	key, _ := pki.LoadSigningKey(f.dir)
	numa := 0
	env, err := task.New(key, taskID, nodeID, task.TypeVMProvision, task.VMProvision{AllocationID: "a1",
		Bundles: []task.Bundle{{SlotID: "s0", GPUPCI: "0000:1b:00.0", FabricVFPCI: "0000:1a:00.2", NVMeDevice: "/dev/disk/by-id/x", NUMANode: &numa}},
		Image:   task.Image{Slug: "i", DigestSHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}, issued, time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.tasks = append(f.tasks, env)
	f.mu.Unlock()
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // condition poll, bounded by the deadline
	}
}

// A result produced while the controller is down is spooled and delivered exactly once
// when it is back; the task id is remembered so a redelivery is refused as a replay and not
// run again. A controller that hands the task out again after acknowledging its result has
// lost that result (restored from a backup taken before it): the host reports the result it
// kept once more, the very same one.
func TestSpoolDeliversAfterOutageExactlyOnce(t *testing.T) {
	f := newFake(t)
	cfg := identity(t, f, "node-1")
	a, err := New(cfg, slog.New(slog.DiscardHandler), "test")
	if err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	f.queue(t, "node-1", "task-1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	waitUntil(t, "the result to be spooled", func() bool { return a.spool.Has("task-1") })
	if f.delivered("task-1") != 0 {
		t.Fatal("delivered while the controller was down")
	}
	f.down.Store(false)
	a.kickSender()
	waitUntil(t, "delivery after the outage", func() bool { return f.delivered("task-1") == 1 })
	waitUntil(t, "the spool to empty", func() bool { return !a.spool.Has("task-1") })
	f.mu.Lock()
	first, _ := json.Marshal(f.last["task-1"])
	f.mu.Unlock()
	if n := f.delivered("task-1"); n != 1 {
		t.Fatalf("result delivered %d times before any redelivery", n)
	}
	// Its first handling over: a task handed out while it is still in flight is ignored.
	waitUntil(t, "the task to leave the host's in-flight set", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return !a.inflight["task-1"]
	})
	// The same task handed out again is a replay: not run, its kept result reported again.
	f.queue(t, "node-1", "task-1")
	a.kickSender()
	waitUntil(t, "the kept result to be reported again", func() bool { return f.delivered("task-1") == 2 })
	cancel()
	<-done
	f.mu.Lock()
	again, _ := json.Marshal(f.last["task-1"])
	f.mu.Unlock()
	if !bytes.Equal(first, again) {
		t.Fatalf("the result reported again differs (the task ran again?):\nfirst %s\nagain %s", first, again)
	}
	done2, _ := a.replay.Completed("task-1", time.Now())
	if !done2 {
		t.Fatal("completed task id not remembered")
	}
}

// A task signed for another node is refused and reported, never run.
func TestForeignTaskRefusedAndReported(t *testing.T) {
	f := newFake(t)
	cfg := identity(t, f, "node-1")
	a, err := New(cfg, slog.New(slog.DiscardHandler), "test")
	if err != nil {
		t.Fatal(err)
	}
	f.queue(t, "node-2", "task-x")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	waitUntil(t, "the refusal to be reported", func() bool { return f.delivered("task-x") == 1 })
	cancel()
	<-done
	if ok, _ := a.replay.Completed("task-x", time.Now()); ok {
		t.Fatal("a foreign task's id was marked completed")
	}
}

// A host whose clock is off from the controller's runs signed tasks while the difference is
// within its clock-skew tolerance, and beyond it refuses them and reports why, naming the
// skew: whole hostd (poll, verify, run, spool, report) over real HTTPS with the host's clock
// moved instead of the machine's.
func TestHostClockSkew(t *testing.T) {
	const tolerance = 2 * time.Minute
	for _, tc := range []struct {
		name       string
		hostOffset time.Duration // host clock minus controller clock
		issuedAgo  time.Duration // the task was signed this long before the controller's now
		want, text string
	}{
		{name: "host behind, within tolerance", hostOffset: -(tolerance - 10*time.Second), want: "succeeded"},
		{name: "host ahead, task near expiry, within tolerance", hostOffset: tolerance - 10*time.Second, issuedAgo: 59 * time.Minute, want: "succeeded"},
		{name: "host behind beyond tolerance", hostOffset: -(tolerance + time.Minute), want: "refused", text: "not_yet_valid: .* ahead of this host's clock .* beyond the 2m0s clock-skew tolerance"},
		{name: "host ahead beyond tolerance", hostOffset: tolerance + time.Minute, issuedAgo: 59 * time.Minute, want: "refused", text: "expired: .* past expiry, beyond the 2m0s clock-skew tolerance"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.redeliver = time.Second
			cfg := identity(t, f, "node-1")
			cfg.ClockSkew = tolerance
			a, err := New(cfg, slog.New(slog.DiscardHandler), "test")
			if err != nil {
				t.Fatal(err)
			}
			a.verifier.Now = func() time.Time { return time.Now().Add(tc.hostOffset) }
			f.queueAt(t, "node-1", "task-skew", time.Now().Add(-tc.issuedAgo))
			res := runUntilReported(t, f, a, "task-skew", func(task.Result) bool { return true })
			if res.Status != tc.want || (tc.text != "" && !regexp.MustCompile(tc.text).MatchString(res.Error)) {
				t.Fatalf("result %s %q, want %s matching %q", res.Status, res.Error, tc.want, tc.text)
			}
			if ran, _ := a.replay.Completed("task-skew", time.Now()); ran != (tc.want == "succeeded") {
				t.Fatalf("task completed here = %v, want %v", ran, tc.want == "succeeded")
			}
			if tc.want != "refused" {
				return
			}
			// The clock put right, the task delivered again (re-signed) runs: a refusal
			// did not burn its id.
			if a, err = New(cfg, slog.New(slog.DiscardHandler), "test"); err != nil {
				t.Fatal(err)
			}
			f.queueAt(t, "node-1", "task-skew", time.Now())
			runUntilReported(t, f, a, "task-skew", func(r task.Result) bool { return r.Status == "succeeded" })
		})
	}
}

// runUntilReported runs a until the controller has accepted a result for id that ok accepts
// and hostd has dropped it from its spool (acknowledged), and returns that result.
func runUntilReported(t *testing.T, f *fakeController, a *Agent, id string, ok func(task.Result) bool) task.Result {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	var last task.Result
	waitUntil(t, "the result to be reported and acknowledged", func() bool {
		f.mu.Lock()
		last = f.last[id]
		n := f.results[id]
		f.mu.Unlock()
		return n > 0 && ok(last) && !a.spool.Has(id)
	})
	cancel()
	<-done
	return last
}
