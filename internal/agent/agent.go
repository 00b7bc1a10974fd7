package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/prereq"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/topology"
)

// Agent is a running gpuaas-hostd.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	version  string
	srv      *servers
	hc       atomic.Pointer[http.Client] // replaced when the certificate is renewed
	cert     atomic.Pointer[tls.Certificate]
	verifier *task.Verifier
	replay   *task.DiskReplayStore
	spool    *Spool
	runtime  slicevm.Runtime
	vm       *vmServices // lab/libvirt only
	sem      chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	inflight map[string]bool
	sendNow  chan struct{}
	running  atomic.Int32
	m        *metrics
	host     hostfs.FS
	knobs    Knobs    // testing hooks (zero in the gpuaas-hostd binary)
	loop     progress // the poll loop's promise to the systemd watchdog
	// metricsAddr is where /metrics listens (set once serving).
	metricsAddr atomic.Value
}

// New loads the identity and prepares state directories.
func New(cfg Config, log *slog.Logger, version string) (*Agent, error) {
	if log == nil {
		log = slog.Default()
	}
	a := &Agent{cfg: cfg, log: log, version: version, srv: newServers(cfg.ServerList()),
		sem: make(chan struct{}, cfg.MaxConcurrent), inflight: map[string]bool{}, sendNow: make(chan struct{}, 1),
		host: hostfs.New(cfg.HostRoot)}
	if err := a.loadCert(); err != nil {
		return nil, err
	}
	tlsCfg, err := pki.ClientTLSConfig(cfg.CAFile)
	if err != nil {
		return nil, err
	}
	tlsCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return a.cert.Load(), nil }
	a.hc.Store(&http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, MaxIdleConnsPerHost: 4}})
	pub, err := pki.LoadSigningPub(cfg.SigningPubFile)
	if err != nil {
		return nil, fmt.Errorf("pinned task-signing key: %w", err)
	}
	if a.replay, err = task.NewDiskReplayStore(filepath.Join(cfg.StateDir, "completed"), cfg.ClockSkew); err != nil {
		return nil, err
	}
	if a.spool, err = NewSpool(filepath.Join(cfg.StateDir, "spool")); err != nil {
		return nil, err
	}
	a.verifier = &task.Verifier{Key: pub, NodeID: cfg.NodeID, Skew: cfg.ClockSkew, Replay: a.replay}
	a.m = newMetrics(a)
	switch cfg.Runtime {
	case "sim":
		a.runtime = slicevm.Sim{PhaseDelay: cfg.SimPhaseDelay, Hold: cfg.SimHoldPhase}
	case "lab", "libvirt":
		if a.runtime, a.vm, err = newVMRuntime(cfg, log); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("runtime %q is not available in this build", cfg.Runtime)
	}
	return a, nil
}

func (a *Agent) loadCert() error {
	c, err := tls.LoadX509KeyPair(a.cfg.CertFile, a.cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("node certificate: %w", err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return err
		}
	}
	a.cert.Store(&c)
	return nil
}

// Run polls, executes, reports and heartbeats until ctx ends, then lets running tasks finish
// (their results are spooled, so none is lost if the process is killed instead).
func (a *Agent) Run(ctx context.Context) error {
	_, _ = daemon.SdNotify(false, daemon.SdNotifyReady)
	_, _ = daemon.SdNotify(false, "STATUS=polling "+a.srv.String()+" as node "+a.cfg.NodeID+" ("+a.runtime.Name()+" runtime)")
	a.log.Info("gpuaas-hostd running", "servers", a.srv.String(), "node", a.cfg.NodeID, "runtime", a.runtime.Name(), "version", a.version)
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	// step bounds one stretch of the loop's own work between blocking calls.
	wd := watchdogInterval()
	step := wd
	if step <= 0 {
		step = time.Minute
	}
	a.loop.expect(step)
	go a.watchdog(bg, wd)
	if a.vm != nil {
		if err := a.vm.start(bg); err != nil {
			return err
		}
		defer a.vm.hyper.Close()
	}
	if a.cfg.MetricsListen != "" {
		if err := a.serveMetrics(bg, a.cfg.MetricsListen); err != nil {
			return fmt.Errorf("metrics listen %s: %w", a.cfg.MetricsListen, err)
		}
	}
	go a.heartbeatLoop(ctx)
	senderDone := make(chan struct{})
	go func() { a.sendLoop(bg); close(senderDone) }()
	a.kickSender()

	backoff := newBackoff()
	waitSlot := time.NewTicker(step / 2)
	defer waitSlot.Stop()
	for ctx.Err() == nil {
		a.loop.expect(step)
		// Waiting for a free task slot is progress: running tasks hold them.
		acquired := false
		for !acquired && ctx.Err() == nil {
			select {
			case a.sem <- struct{}{}:
				acquired = true
			case <-waitSlot.C:
				a.loop.expect(step)
			case <-ctx.Done():
			}
		}
		if !acquired {
			continue
		}
		a.knobs.loopStep(ctx)
		// Every free task slot is offered in one poll: a burst of tasks arrives together.
		slots := 1
	more:
		for slots < min(cap(a.sem), maxPollTasks) {
			select {
			case a.sem <- struct{}{}:
				slots++
			default:
				break more
			}
		}
		a.loop.expect(pollTimeout(a.cfg.PollWait) + step)
		envs, err := a.poll(ctx, slots)
		for i := len(envs); i < slots; i++ {
			<-a.sem // slots not used by a task
		}
		if err != nil {
			if ctx.Err() == nil {
				a.m.pollErrors.Inc()
				d := backoff.next()
				a.loop.expect(d + step)
				a.log.Warn("poll failed; retrying", "err", err, "in", d)
				sleepCtx(ctx, d)
			}
			continue
		}
		backoff.reset()
		for _, env := range envs {
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				if env.Type == task.TypeTerminalOpen {
					// Sessions are long-lived: they do not hold a task slot, and they end when
					// hostd stops.
					<-a.sem
					a.execute(ctx, env)
					return
				}
				defer func() { <-a.sem }()
				a.execute(bg, env)
			}()
		}
	}
	// Stopping: TimeoutStopSec bounds the wait for running tasks, not the watchdog.
	a.loop.expect(24 * time.Hour)
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	a.log.Info("stopping: no new tasks; waiting for running ones")
	a.wg.Wait()
	a.kickSender()
	// Give the sender a moment to deliver what just finished; the spool keeps the rest.
	flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.sendPending(flush)
	stopBG()
	<-senderDone
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

type backoff struct{ n int }

func newBackoff() *backoff { return &backoff{} }
func (b *backoff) reset()  { b.n = 0 }
func (b *backoff) next() time.Duration {
	b.n++
	d := 500 * time.Millisecond << min(b.n-1, 6) // 0.5s .. 32s
	j, _ := rand.Int(rand.Reader, big.NewInt(int64(d/2)+1))
	return d/2 + time.Duration(j.Int64()) // full jitter in [d/2, d]
}

func (a *Agent) do(ctx context.Context, method, path string, body any) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, nil, err
		}
		rd = bytes.NewReader(b)
	}
	base, idx := a.srv.current()
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "gpuaas-hostd/"+a.version)
	resp, err := a.hc.Load().Do(req)
	if err != nil {
		// A deadline (a blackholed connection) counts against the server; shutdown does not.
		if !errors.Is(ctx.Err(), context.Canceled) && a.srv.failover(idx) {
			a.log.Warn("controller unreachable; failing over", "server", base, "err", err)
		}
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err == nil && unavailable(resp.StatusCode) && a.srv.failover(idx) {
		// A replica without its database, or a proxy without a backend: another may answer.
		a.log.Warn("controller unavailable; failing over", "server", base, "status", resp.Status)
	}
	return resp, data, err
}

// unavailable is an answer that says "try again, maybe elsewhere": nothing was applied.
func unavailable(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

func apiError(resp *http.Response, data []byte) error {
	var ae apiv1.Error
	if json.Unmarshal(data, &ae) == nil && ae.Code != "" {
		return fmt.Errorf("%s: %s (%s)", resp.Status, ae.Message, ae.Code)
	}
	return fmt.Errorf("%s", resp.Status)
}

// jitterWait spreads a long poll's wait over the 20% below d (whole milliseconds), so hosts
// that reconnected together (a controller restart) do not renew their polls in waves. The
// configured wait is the most a poll asks for: poll_wait may be the controller's maximum (60s),
// and a wait above it is refused (jitter of ±10% made every other poll at 60s a 400).
func jitterWait(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d
	}
	n, err := rand.Int(rand.Reader, big.NewInt(int64(d)/5+1))
	if err != nil {
		return d
	}
	return (d - time.Duration(n.Int64())).Truncate(time.Millisecond)
}

// maxPollTasks is the most tasks one poll asks for (the controller's limit).
const maxPollTasks = 64

// pollTimeout bounds one long poll of wait.
func pollTimeout(wait time.Duration) time.Duration { return wait + 15*time.Second }

// poll long-polls for up to max tasks (none when the wait ends empty).
func (a *Agent) poll(ctx context.Context, max int) ([]*task.Envelope, error) {
	wait := jitterWait(a.cfg.PollWait)
	pctx, cancel := context.WithTimeout(ctx, pollTimeout(wait))
	defer cancel()
	resp, data, err := a.do(pctx, "GET", fmt.Sprintf("/api/v1/agent/tasks?wait=%s&max=%d", wait, max), nil)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusNoContent:
		return nil, nil
	case http.StatusOK:
		var b task.Batch
		if err := json.Unmarshal(data, &b); err != nil {
			return nil, fmt.Errorf("task batch: %w", err)
		}
		if len(b.Tasks) > max {
			return nil, fmt.Errorf("task batch: %d tasks for %d slots", len(b.Tasks), max)
		}
		for _, env := range b.Tasks {
			if env == nil {
				return nil, errors.New("task batch: null task")
			}
		}
		return b.Tasks, nil
	}
	return nil, apiError(resp, data)
}

// execute verifies and runs one task; at most one run per task id at a time, and a task
// whose result is already spooled or completed is never run again.
func (a *Agent) execute(ctx context.Context, env *task.Envelope) {
	a.mu.Lock()
	if a.inflight[env.TaskID] {
		a.mu.Unlock()
		return
	}
	a.inflight[env.TaskID] = true
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.inflight, env.TaskID)
		a.mu.Unlock()
	}()
	a.running.Add(1)
	defer a.running.Add(-1)

	if !taskIDSafe(env.TaskID) {
		a.log.Warn("task refused: malformed task id", "task", env.TaskID)
		return
	}
	if a.spool.Has(env.TaskID) {
		a.kickSender() // finished before a restart; only the report is outstanding
		return
	}
	log := a.log.With("task", env.TaskID, "type", env.Type, "attempt", env.Attempt)
	payload, err := a.verifier.Verify(env)
	res := task.Result{TaskID: env.TaskID, Attempt: env.Attempt}
	var refused *task.RefusedError
	switch {
	case errors.As(err, &refused):
		log.Warn("task refused", "reason", refused.Reason, "detail", refused.Detail)
		a.m.refusals.WithLabelValues(refused.Reason).Inc()
		res.Status, res.Error = "refused", refused.Reason+": "+refused.Detail
		if refused.Reason == task.RefuseReplay {
			return // already completed here; its result was delivered before
		}
		if refused.Reason == task.RefuseWrongNode || refused.Reason == task.RefuseBadSignature || refused.Reason == task.RefuseUnsigned {
			// Not ours or not authentic: report it, but never mark its id completed.
			_ = a.spool.Put(res)
			a.kickSender()
			return
		}
	case err != nil:
		log.Error("task verification failed", "err", err)
		return // retried on redelivery
	default:
		if err := a.writableFor(env.Type); err != nil {
			// A host that cannot record what it did changes nothing: its result could not
			// be kept, nor its completion (a redelivery could run it twice). The controller
			// is told why; the slots wait for a verified wipe. Read-only tasks still run.
			log.Error("state dir not writable; task not started", "err", err)
			a.m.tasks.WithLabelValues(string(env.Type), "failed").Inc()
			res.Status, res.Reason, res.Error, res.Phases = "failed", ReasonStateUnwritable, ReasonStateUnwritable+": "+err.Error(), []task.Phase{}
			a.deliver(ctx, res)
			return
		}
		log.Info("task started")
		start := time.Now()
		res = a.run(ctx, env, payload)
		a.m.duration.WithLabelValues(string(env.Type)).Observe(time.Since(start).Seconds())
		a.m.tasks.WithLabelValues(string(env.Type), res.Status).Inc()
		log.Info("task finished", "status", res.Status, "error", res.Error)
	}
	if err := a.spool.Put(res); err != nil {
		// Not kept: deliver it now; if that fails too, the task is redelivered.
		log.Error("cannot spool result; delivering it directly", "err", err)
		a.deliver(ctx, res)
		return
	}
	// A refused task did not run: its id is not recorded as completed, so a later delivery
	// that verifies (a host clock put right, a re-signed attempt) can still run it once.
	if res.Status != "refused" {
		if err := a.replay.MarkCompleted(env.TaskID, env.NotAfter); err != nil {
			log.Error("cannot record completion", "err", err)
		}
	}
	a.kickSender()
}

func (a *Agent) run(ctx context.Context, env *task.Envelope, payload any) task.Result {
	res := task.Result{TaskID: env.TaskID, Attempt: env.Attempt}
	// Live progress goes out in the background, coalesced: a phase never waits for the
	// controller, and a burst of short phases costs one report per progressEvery, not one each.
	keep, stopKeep := context.WithCancel(ctx)
	defer stopKeep()
	pump := newProgressPump()
	rec := &slicevm.Recorder{TaskID: env.TaskID, OnUpdate: pump.update, AfterWork: a.knobs.phaseHook(ctx, env, payload)}
	go func() {
		// Keep the lease alive through long phases: report progress at least every 10s.
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-keep.Done():
				return
			case <-t.C:
				pump.update(rec.Phases())
			case <-pump.wake:
			}
			if ph, ok := pump.take(); ok {
				a.progress(env.TaskID, ph)
				sleepCtx(keep, progressEvery)
			}
		}
	}()
	var out any
	var err error
	switch p := payload.(type) {
	case *task.VMProvision:
		out, err = a.runtime.Provision(ctx, p, rec)
	case *task.VMRelease:
		var ro task.ReleaseOutput
		ro, err = a.runtime.Release(ctx, p, rec)
		a.signProofs(env, p.AllocationID, ro.Wiped)
		out = ro
	case *task.StorageTransition:
		err = rec.Run("storage_transition", func() error {
			if p.To != "slice" {
				return fmt.Errorf("only the transition to slice ownership is supported, not %q", p.To)
			}
			res, terr := a.wiper().Transition(ctx, disk.TransitionOptions{Devices: p.Devices, Apply: p.Apply, NodeName: p.Node, Confirm: p.Node})
			out = res
			return terr
		})
	case *task.WipeVerify:
		err = rec.Run("wipe_verify", func() error {
			ev, werr := a.wiper().WipeWith(ctx, disk.WipeOptions{Device: p.Device, Apply: p.Apply, Policy: p.Policy, Identity: p.DiskIdentity})
			out = a.signedWipe(env, p, ev, werr)
			if werr == nil && p.Apply && !ev.Verified {
				werr = fmt.Errorf("wipe not verified: %s", ev.Error)
			}
			return werr
		})
	case *task.Reconcile:
		err = rec.Run("reconcile", func() error {
			r, ok := a.runtime.(slicevm.Reconciler)
			if !ok {
				return fmt.Errorf("runtime %s cannot reconcile", a.runtime.Name())
			}
			rep, rerr := r.Reconcile(ctx, p)
			out = rep
			return rerr
		})
	case *task.TerminalOpen:
		err = rec.Run("terminal_session", func() error {
			o, terr := a.terminalOpen(ctx, p)
			out = o
			return terr
		})
	case *task.PrereqCheck:
		err = rec.Run("prereq_check", func() error {
			out = prereq.Run(a.host, prereq.Options{HugepagesGiB: p.HugepagesGiB, Bridge: p.Bridge})
			return nil
		})
	case *task.TopologyDiscover:
		err = rec.Run("topology_discover", func() error {
			r, derr := topology.Discover(a.host)
			out = r
			return derr
		})
	default:
		err = fmt.Errorf("task type %s has no handler on this host yet", env.Type)
	}
	res.Phases = rec.Phases()
	if res.Phases == nil {
		res.Phases = []task.Phase{}
	}
	if out != nil {
		res.Output, _ = json.Marshal(out)
	}
	if err != nil {
		res.Status, res.Error = "failed", err.Error()
		var pi *slicevm.PlanInvalidError
		if errors.As(err, &pi) {
			res.Reason = "plan_invalid"
		}
	} else {
		res.Status = "succeeded"
	}
	return res
}

// progressEvery is the most often one task's live progress is reported.
const progressEvery = 250 * time.Millisecond

// progressPump holds a task's latest phases until the reporter takes them.
type progressPump struct {
	mu     sync.Mutex
	latest []task.Phase
	dirty  bool
	wake   chan struct{}
}

func newProgressPump() *progressPump { return &progressPump{wake: make(chan struct{}, 1)} }

func (p *progressPump) update(ph []task.Phase) {
	p.mu.Lock()
	p.latest, p.dirty = ph, true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *progressPump) take() ([]task.Phase, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ok := p.dirty
	p.dirty = false
	return p.latest, ok
}

// progress reports live phases (best effort; the final result carries them all).
func (a *Agent) progress(taskID string, phases []task.Phase) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if resp, data, err := a.do(ctx, "POST", "/api/v1/agent/tasks/"+taskID+"/progress", task.Progress{Phases: phases}); err != nil {
		a.log.Debug("progress not delivered", "task", taskID, "err", err)
	} else if resp.StatusCode >= 300 {
		a.log.Debug("progress refused", "task", taskID, "err", apiError(resp, data))
	}
}

func (a *Agent) kickSender() {
	select {
	case a.sendNow <- struct{}{}:
	default:
	}
}

func (a *Agent) sendLoop(ctx context.Context) {
	retry := time.NewTicker(5 * time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.sendNow:
		case <-retry.C:
		}
		a.sendPending(ctx)
	}
}

// resultTimeout bounds one result delivery.
const resultTimeout = 30 * time.Second

// writableFor checks the state dir can take the result of a task of type t, when t is one
// that changes the host.
func (a *Agent) writableFor(t task.Type) error {
	if !changesHost(t) {
		return nil
	}
	return a.spool.Writable()
}

// changesHost reports whether a task type writes to the host (VMs, disks): those are not
// started while the state dir cannot record their outcome.
func changesHost(t task.Type) bool {
	switch t {
	case task.TypeVMProvision, task.TypeVMRelease, task.TypeStorageTransit, task.TypeWipeVerify:
		return true
	}
	return false
}

// ReasonStateUnwritable is a task result's reason when hostd's state dir cannot be written
// (full or read-only): the task was not started.
const ReasonStateUnwritable = "host_state_unwritable"

// deliver sends one result that is not in the spool (best effort: an unacknowledged task is
// redelivered when its lease ends).
func (a *Agent) deliver(ctx context.Context, r task.Result) {
	dctx, cancel := context.WithTimeout(ctx, resultTimeout)
	defer cancel()
	resp, data, err := a.do(dctx, "POST", "/api/v1/agent/tasks/"+r.TaskID+"/result", r)
	switch {
	case err != nil:
		a.log.Warn("unspooled result not delivered; the task will be redelivered", "task", r.TaskID, "err", err)
	case resp.StatusCode >= 300:
		a.log.Warn("unspooled result refused", "task", r.TaskID, "err", apiError(resp, data))
	}
}

// sendPending delivers spooled results; each is removed only once acknowledged.
func (a *Agent) sendPending(ctx context.Context) {
	pending, err := a.spool.Pending()
	if err != nil {
		a.log.Error("spool", "err", err)
		return
	}
	for _, r := range pending {
		// Bounded: a connection blackholed by a partition must not hold the sender forever
		// (the transport has no timeout of its own: long polls share it).
		rctx, cancel := context.WithTimeout(ctx, resultTimeout)
		resp, data, err := a.do(rctx, "POST", "/api/v1/agent/tasks/"+r.TaskID+"/result", r)
		cancel()
		if err != nil {
			a.log.Debug("result not delivered yet", "task", r.TaskID, "err", err)
			return // controller unreachable: keep everything, retry later
		}
		switch {
		case resp.StatusCode < 300:
			_ = a.spool.Remove(r.TaskID)
		case resp.StatusCode >= 500:
			return
		default:
			// The controller will never accept it (unknown task, bad body): keep a log, drop it.
			a.log.Error("result rejected; dropping", "task", r.TaskID, "err", apiError(resp, data))
			_ = a.spool.Remove(r.TaskID)
		}
	}
}

func (a *Agent) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	for {
		a.sendHeartbeat(ctx)
		a.maybeRenew(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) sendHeartbeat(ctx context.Context) {
	facts, _ := json.Marshal(a.facts())
	hb := apiv1.Heartbeat{AgentVersion: a.version, Runtime: a.runtime.Name(), RunningTasks: int(a.running.Load()),
		TaskTypes: []string{string(task.TypeVMProvision), string(task.TypeVMRelease), string(task.TypeTopologyDiscover), string(task.TypePrereqCheck),
			string(task.TypeStorageTransit), string(task.TypeWipeVerify)}, Facts: facts,
		FirmwareProfile: a.firmwareEvidence(), Prerequisites: a.prereqSummary()}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, data, err := a.do(hctx, "POST", "/api/v1/agent/heartbeat", hb)
	if err != nil {
		a.log.Debug("heartbeat not delivered", "err", err)
		return
	}
	if resp.StatusCode >= 300 {
		a.log.Warn("heartbeat refused", "err", apiError(resp, data))
	}
}

// maybeRenew rotates the node certificate once less than a third of its life remains.
func (a *Agent) maybeRenew(ctx context.Context) {
	leaf := a.cert.Load().Leaf
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	if time.Until(leaf.NotAfter) > life/3 {
		return
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return
	}
	pubDER, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	resp, data, err := a.do(ctx, "POST", "/api/v1/agent/renew", apiv1.EnrollRequest{
		PublicKeyPEM: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))})
	if err != nil || resp.StatusCode != http.StatusCreated {
		a.log.Warn("certificate renewal failed; will retry", "err", err, "not_after", leaf.NotAfter)
		return
	}
	var en apiv1.Enrollment
	if err := json.Unmarshal(data, &en); err != nil {
		return
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	if err := mkdirWrite(a.cfg.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})); err != nil {
		a.log.Error("writing renewed key", "err", err)
		return
	}
	if err := mkdirWrite(a.cfg.CertFile, []byte(en.CertificatePEM)); err != nil {
		a.log.Error("writing renewed certificate", "err", err)
		return
	}
	if err := a.loadCert(); err != nil {
		a.log.Error("loading renewed certificate", "err", err)
		return
	}
	a.freshConnections()
	a.log.Info("node certificate renewed", "not_after", en.NotAfter)
}

// freshConnections makes later requests dial new TLS connections, which present the current
// certificate: kept-alive ones (a busy long poll's never idles) still carry the superseded
// one, which the controller stops accepting after a short grace.
func (a *Agent) freshConnections() {
	old := a.hc.Load()
	tr, ok := old.Transport.(*http.Transport)
	if !ok {
		return
	}
	a.hc.Store(&http.Client{Transport: tr.Clone()})
	tr.CloseIdleConnections() // in-flight requests finish on the old transport
}

func taskIDSafe(id string) bool {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\\") || strings.HasPrefix(id, ".") {
		return false
	}
	return true
}

func (a *Agent) wiper() disk.Wiper { return disk.Wiper{FS: a.host, Run: hostfs.Exec{}} }
