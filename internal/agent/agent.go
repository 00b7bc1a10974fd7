package agent

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/gpuaas/gpuaas/internal/health"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
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
	// guestHealth carries guests' health readings to the health loop (guestReport).
	guestHealth chan []health.Finding
	guestMu     sync.Mutex
	guestLast   map[string]time.Time // allocation -> when its guest's readings were last taken
}

// New loads the identity and prepares state directories.
func New(cfg Config, log *slog.Logger, version string) (*Agent, error) {
	if log == nil {
		log = slog.Default()
	}
	a := &Agent{cfg: cfg, log: log, version: version, srv: newServers(cfg.ServerList()),
		sem: make(chan struct{}, cfg.MaxConcurrent), inflight: map[string]bool{}, sendNow: make(chan struct{}, 1),
		host: hostfs.New(cfg.HostRoot), guestHealth: make(chan []health.Finding, 16), guestLast: map[string]time.Time{}}
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
		a.vm.telemetry.OnReport = a.guestReport
		a.m.registerImageCache(a.vm.images)
	default:
		return nil, fmt.Errorf("runtime %q is not available in this build", cfg.Runtime)
	}
	return a, nil
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
	if a.cfg.HealthInterval > 0 {
		go a.healthLoop(ctx)
	}
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
