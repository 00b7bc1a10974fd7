// Package provision measures provisioning overhead: from an allocation's
// commit to the first provisioning phase started on its host, with many allocations created
// at once, on real gpuaas-hostd processes (sim runtime: the VM itself is simulated, every
// other step is real: enrollment, mTLS long polls, signed tasks, progress and results).
package provision

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

// Result is one measured burst.
type Result struct {
	Hosts            int     `json:"hosts"`
	Allocations      int     `json:"allocations"`
	FirstPhaseP50ms  float64 `json:"first_phase_p50_ms"` // commit -> first phase started on the host
	FirstPhaseP99ms  float64 `json:"first_phase_p99_ms"`
	FirstPhaseMaxms  float64 `json:"first_phase_max_ms"`
	QueuedP50ms      float64 `json:"queued_p50_ms"` // commit -> host task queued by the outbox worker
	QueuedP99ms      float64 `json:"queued_p99_ms"`
	ActiveP50ms      float64 `json:"active_p50_ms"` // commit -> allocation active (17 phases at the sim delay)
	ActiveP99ms      float64 `json:"active_p99_ms"`
	SimPhaseDelayMS  int     `json:"sim_phase_delay_ms"`
	Failed           int     `json:"failed"`
	SetupSeconds     float64 `json:"setup_seconds"`
	ReleasedVerified int     `json:"released"`
}

// Fleet is a set of enrolled sim hosts with approved slots.
type Fleet struct {
	env   *benchenv.Env
	bin   string
	admin *client.Client
	hosts []*host
	image string
	opts  Options
}

// host is one enrolled gpuaas-hostd: its config (identity included) survives a restart.
type host struct {
	name, dir, cfg, log string
	mu                  sync.Mutex
	cmd                 *exec.Cmd
	exited              chan struct{} // closed once cmd has been waited for
}

const simPhaseDelay = 20 * time.Millisecond

// Options shapes a fleet; zero values take the defaults of Start.
type Options struct {
	Hosts         int
	Prefix        string        // host names are Prefix-NNN (default "prov")
	PhaseDelay    time.Duration // sim time per phase (default 20ms)
	Heartbeat     time.Duration // hostd heartbeat (default 2s)
	MaxConcurrent int           // tasks a host runs at once (default 8)
	Setup         int           // hosts enrolled and approved at once (default 8)
}

func (o *Options) defaults() {
	if o.Prefix == "" {
		o.Prefix = "prov"
	}
	if o.PhaseDelay == 0 {
		o.PhaseDelay = simPhaseDelay
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = 2 * time.Second
	}
	if o.MaxConcurrent == 0 {
		o.MaxConcurrent = 8
	}
	if o.Setup == 0 {
		o.Setup = 8
	}
}

// Start registers hosts nodes, enrolls a gpuaas-hostd (sim runtime, a generated 8x H200
// host tree: the fake boundary for hardware this machine lacks) for each, discovers their
// topology through signed tasks and approves their slots, as an operator would.
func Start(ctx context.Context, env *benchenv.Env, bin string, hosts int) (*Fleet, error) {
	return StartWith(ctx, env, bin, Options{Hosts: hosts})
}

// StartWith is Start with options.
func StartWith(ctx context.Context, env *benchenv.Env, bin string, o Options) (*Fleet, error) {
	o.defaults()
	tokFile := pki.Paths{Dir: env.StateDir}.AdminToken()
	tok, err := os.ReadFile(tokFile)
	if err != nil {
		return nil, err
	}
	admin, err := client.New(client.Options{Server: env.Server, CAFile: env.CAFile, Token: string(bytes.TrimSpace(tok)), UserAgent: "gpuaas-bench"})
	if err != nil {
		return nil, err
	}
	f := &Fleet{env: env, bin: bin, admin: admin, opts: o}
	if err := f.registerImage(ctx); err != nil {
		return nil, err
	}
	f.hosts = make([]*host, o.Hosts)
	errs := make([]error, o.Hosts)
	sem := make(chan struct{}, o.Setup)
	var wg sync.WaitGroup
	for i := range f.hosts {
		name := fmt.Sprintf("%s-%03d", o.Prefix, i)
		h := &host{name: name, dir: filepath.Join(env.Dir, "hosts", name)}
		f.hosts[i] = h
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := f.enroll(ctx, h, h.dir)
			if err == nil {
				err = f.approve(ctx, name)
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		f.Stop()
		return nil, err
	}
	return f, nil
}

// Admin is the operator's API client.
func (f *Fleet) Admin() *client.Client { return f.admin }

// Image is the slug of the fleet's digest-pinned slice image.
func (f *Fleet) Image() string { return f.image }

// Len is the number of hosts.
func (f *Fleet) Len() int { return len(f.hosts) }

// Name is host i's node name.
func (f *Fleet) Name(i int) string { return f.hosts[i].name }

// StateDir is host i's hostd state directory (spool, completed tasks).
func (f *Fleet) StateDir(i int) string { return filepath.Join(f.hosts[i].dir, "state") }

// Log is host i's hostd log file.
func (f *Fleet) Log(i int) string { return f.hosts[i].log }

// Kill ends host i's gpuaas-hostd with SIGKILL (no chance to finish or spool anything) and
// waits until it has exited.
func (f *Fleet) Kill(i int) error {
	h := f.hosts[i]
	h.mu.Lock()
	cmd, exited := h.cmd, h.exited
	h.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%s: not running", h.name)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: kill: %w", h.name, err)
	}
	<-exited
	return nil
}

// Restart starts host i's gpuaas-hostd again with its enrolled identity (after Kill), with
// extra `run` flags for this run only (e.g. --sim-hold-phase).
func (f *Fleet) Restart(i int, extra ...string) error { return f.run(f.hosts[i], extra...) }

// Running reports whether host i's daemon is up (it may also have exited by itself).
func (f *Fleet) Running(i int) bool {
	h := f.hosts[i]
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.exited == nil {
		return false
	}
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

// registerImage adds a digest-pinned slice image whose artifact is a local file.
func (f *Fleet) registerImage(ctx context.Context) error {
	art := filepath.Join(f.env.Dir, "bench-image.qcow2")
	data := bytes.Repeat([]byte("gpuaas bench image\n"), 4096)
	if err := os.WriteFile(art, data, 0o644); err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	f.image = "bench-file-image"
	_, err := f.admin.CreateImage(ctx, apiv1.OSImage{Slug: f.image, DisplayName: "bench file image", Version: "1", Target: "vm_slice",
		Family: "debian", Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "file://" + art,
		DigestSHA256: hex.EncodeToString(sum[:]), DefaultUsername: "debian", DriverStrategy: "none", Active: true})
	return err
}

func (f *Fleet) enroll(ctx context.Context, h *host, dir string) error {
	n, err := f.admin.CreateNode(ctx, apiv1.NodeCreate{Name: h.name, Region: "bench", SKU: "h200-sxm-baremetal-8g", SliceSKU: benchenv.SliceSKU,
		ProfileTags: []string{"gpuaas-profile-slice-vm"}, HardwareTags: []string{"gpu-nvidia-h200"}})
	if err != nil {
		return err
	}
	root := filepath.Join(dir, "root")
	if err := fixture.Write(root, fixture.H200()); err != nil {
		return err
	}
	evidence := filepath.Join(root, "var/lib/gpuaas/firmware-profile/evidence.json")
	if err := os.MkdirAll(filepath.Dir(evidence), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(evidence, []byte(`{"profile_tag":"gpuaas-profile-slice-vm","version":"fixture-1","status":"verified"}`), 0o644); err != nil {
		return err
	}
	h.cfg, h.log = filepath.Join(dir, "hostd.yaml"), filepath.Join(dir, "hostd.log")
	out, err := exec.CommandContext(ctx, filepath.Join(f.bin, "gpuaas-hostd"), "enroll", "--server", f.env.Server, "--ca-file", f.env.CAFile,
		"--token", n.BootstrapToken, "--config", h.cfg, "--runtime", "sim", "--host-root", root, "--state-dir", filepath.Join(dir, "state")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("enroll: %v\n%s", err, out)
	}
	return f.run(h)
}

// run starts h's daemon with extra flags, appending to its log.
func (f *Fleet) run(h *host, extra ...string) error {
	log, err := os.OpenFile(h.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the child holds its own descriptor
	args := append([]string{"run", "--config", h.cfg, "--heartbeat", f.opts.Heartbeat.String(),
		"--sim-phase-delay", f.opts.PhaseDelay.String(), "--max-concurrent", fmt.Sprint(f.opts.MaxConcurrent)}, extra...)
	cmd := exec.Command(filepath.Join(f.bin, "gpuaas-hostd"), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.exited != nil {
		select {
		case <-h.exited:
		default:
			return fmt.Errorf("%s: already running", h.name)
		}
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	h.cmd, h.exited = cmd, exited
	return nil
}

// approve waits for the host's first heartbeat, then discovers and approves its slots.
func (f *Fleet) approve(ctx context.Context, name string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := f.admin.GetNode(ctx, name)
		if err == nil && n.LastHeartbeatAt != nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no heartbeat in 60s (last error %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The same calls as `gpuaasctl topology discover --wait` and `slots approve --all-ready`,
	// made in process: 200 hosts are 400 fewer processes to start on a 2-core machine.
	d, err := f.admin.DiscoverTopology(ctx, name)
	if err != nil {
		return fmt.Errorf("discover: %w", err)
	}
	for d.Status != "succeeded" {
		switch d.Status {
		case "failed", "refused", "expired":
			return fmt.Errorf("discovery %s: %s", d.Status, d.Error)
		}
		if time.Now().After(deadline.Add(2 * time.Minute)) {
			return fmt.Errorf("discovery still %s", d.Status)
		}
		time.Sleep(100 * time.Millisecond)
		if d, err = f.admin.GetTopology(ctx, name); err != nil {
			return fmt.Errorf("discover: %w", err)
		}
	}
	res, err := f.admin.ApproveSlots(ctx, name, apiv1.SlotApprove{AllReady: true})
	if err != nil {
		return fmt.Errorf("approve: %w", err)
	}
	if res == nil || len(res.Changes) == 0 {
		return fmt.Errorf("approve: no ready candidate slots")
	}
	return nil
}

// Stop ends the host daemons.
func (f *Fleet) Stop() {
	for _, h := range f.hosts {
		if h != nil && h.cmd != nil {
			_ = h.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, h := range f.hosts {
		if h == nil || h.cmd == nil {
			continue
		}
		select {
		case <-h.exited:
		case <-time.After(10 * time.Second):
			_ = h.cmd.Process.Kill()
			<-h.exited
		}
	}
}

// Burst creates n 1-GPU allocations at once (one client each), waits until every one is
// active or failed, reads each provisioning task's first phase start, then releases them all.
func (f *Fleet) Burst(ctx context.Context, n int) (Result, error) {
	res := Result{Hosts: len(f.hosts), Allocations: n, SimPhaseDelayMS: int(f.opts.PhaseDelay.Milliseconds())}
	type made struct {
		a   *apiv1.Allocation
		err error
	}
	out := make([]made, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		c, err := f.env.Client()
		if err != nil {
			return res, err
		}
		// Connected (TLS handshake done) before the burst: what is measured starts at commit.
		if _, err := c.Whoami(ctx); err != nil {
			return res, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a, err := c.CreateAllocation(ctx, apiv1.AllocationCreate{SKU: benchenv.SliceSKU, GPUs: 1, Image: f.image}, "")
			out[i] = made{a, err}
		}()
	}
	close(start)
	wg.Wait()
	var firsts, queued, actives []time.Duration
	tenant, err := f.env.Client()
	if err != nil {
		return res, err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for _, m := range out {
		if m.err != nil {
			return res, fmt.Errorf("create: %w", m.err)
		}
		var a *apiv1.Allocation
		for {
			a, err = tenant.GetAllocation(ctx, m.a.ID)
			if err != nil {
				return res, err
			}
			if a.Status == "active" || a.Status == "failed" || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if a.Status != "active" {
			res.Failed++
			continue
		}
		tasks, err := f.admin.ListTasks(ctx, "", a.ID)
		if err != nil {
			return res, err
		}
		first := time.Time{}
		for _, t := range tasks {
			if t.Type != "slice.vm_provision" {
				continue
			}
			full, err := f.admin.GetTask(ctx, t.ID)
			if err != nil {
				return res, err
			}
			if len(full.Phases) > 0 && (first.IsZero() || full.Phases[0].StartedAt.Before(first)) {
				first = full.Phases[0].StartedAt
				queued = append(queued, full.CreatedAt.Sub(a.CreatedAt))
			}
		}
		if first.IsZero() {
			return res, fmt.Errorf("allocation %s: no provisioning phases recorded", a.ID)
		}
		firsts = append(firsts, first.Sub(a.CreatedAt))
		if a.ActiveAt != nil {
			actives = append(actives, a.ActiveAt.Sub(a.CreatedAt))
		}
	}
	res.FirstPhaseP50ms, res.FirstPhaseP99ms, res.FirstPhaseMaxms = benchenv.Percentile(firsts, 50), benchenv.Percentile(firsts, 99), benchenv.Percentile(firsts, 100)
	res.ActiveP50ms, res.ActiveP99ms = benchenv.Percentile(actives, 50), benchenv.Percentile(actives, 99)
	res.QueuedP50ms, res.QueuedP99ms = benchenv.Percentile(queued, 50), benchenv.Percentile(queued, 99)
	for _, m := range out {
		if _, err := tenant.ReleaseAllocation(ctx, m.a.ID); err != nil {
			return res, fmt.Errorf("release: %w", err)
		}
	}
	for _, m := range out {
		for {
			a, err := tenant.GetAllocation(ctx, m.a.ID)
			if err != nil {
				return res, err
			}
			if a.Status == "released" {
				res.ReleasedVerified++
				break
			}
			if time.Now().After(deadline) {
				return res, fmt.Errorf("allocation %s still %s after release", a.ID, a.Status)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return res, nil
}
