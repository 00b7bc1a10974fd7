package skew

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

const image = "skew-slice-image"

// plane is one PostgreSQL with controller replicas A and B and sim hosts, each process
// started from whichever release's binaries the test says.
type plane struct {
	t      *testing.T
	ctx    context.Context
	dir    string
	A, B   *benchenv.Env
	admin  *client.Client
	tenant *client.Client
	hosts  []*host
}

type host struct {
	p      *plane
	name   string
	dir    string
	args   []string
	cmd    *exec.Cmd
	exited <-chan error
}

// ctlFlags are what both releases' controllers run with (the sim hosts and the untested
// fixture image are allowed through GPUAAS_ALLOW_SIMULATED_HOSTS and
// GPUAAS_ALLOW_UNTESTED_IMAGES, which benchenv sets).
var ctlFlags = []string{"--task-lease", "5s"}

// start brings up PostgreSQL migrated by bin's `gpuaas-controller migrate`, seeds a tenant,
// and starts controller A from bin.
func start(t *testing.T, bin string) *plane {
	t.Helper()
	pgtest.RequireServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	root, err := os.MkdirTemp("", "gpuaas-skew-")
	if err == nil {
		err = os.Chmod(root, 0o755) // PostgreSQL runs as its own user when we are root
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, root)
		}
		if os.Getenv("GPUAAS_SKEW_KEEP") == "" {
			os.RemoveAll(root)
		}
	})
	p := &plane{t: t, ctx: ctx, dir: root}
	pg, err := pgserver.Start(ctx, pgserver.Options{Dir: filepath.Join(root, "pg"), Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := pki.NewToken("gpa_")
	if err != nil {
		t.Fatal(err)
	}
	if p.A, err = benchenv.Adopt(ctx, filepath.Join(root, "a"), pg, filepath.Join(root, "a", "state"), tok); err != nil {
		_ = pg.Stop()
		t.Fatal(err)
	}
	t.Cleanup(p.A.Stop)
	if err := os.MkdirAll(p.A.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(bin, "gpuaas-controller"), "migrate", "--database-url", p.A.DBURL).CombinedOutput(); err != nil {
		t.Fatalf("migrate with %s: %v\n%s", bin, err, out)
	}
	// Seed a tenant and its token in the schema that release made (tables this tree's store
	// writes the same way).
	if err := p.A.Store.InTx(ctx, func(tx *store.Tx) error {
		tn, err := tx.CreateTenant(ctx, "skew")
		if err != nil {
			return err
		}
		_, err = tx.CreateToken(ctx, "skew-tenant", pki.HashToken(tok), "tenant", tn.ID, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.A.StartController(ctx, bin, ctlFlags...); err != nil {
		t.Fatalf("start controller A: %v", err)
	}
	adminTok, err := os.ReadFile(pki.Paths{Dir: p.A.StateDir}.AdminToken())
	if err != nil {
		t.Fatal(err)
	}
	if p.admin, err = client.New(client.Options{Server: p.A.Server, CAFile: p.A.CAFile, Token: string(bytes.TrimSpace(adminTok))}); err != nil {
		t.Fatal(err)
	}
	// The slice image goes in through the previous release's own API, in the fields it knows:
	// this tree's store writes columns its schema does not have yet.
	p.seedImage(string(bytes.TrimSpace(adminTok)))
	return p
}

// seedImage registers the test's slice image through controller A's API as the previous
// release accepts it (its decoder refuses fields it does not know).
func (p *plane) seedImage(adminToken string) {
	p.t.Helper()
	tlsCfg, err := pki.ClientTLSConfig(p.A.CAFile)
	if err != nil {
		p.t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"slug": image, "display_name": "skew", "version": "1", "target": "vm_slice",
		"family": "debian", "architecture": "amd64", "image_format": "qcow2", "source_type": "http",
		"source_ref": "https://images.example/skew.qcow2", "digest_sha256": strings.Repeat("cd", 32),
		"default_username": "debian", "driver_strategy": "none", "active": true})
	req, err := http.NewRequestWithContext(p.ctx, "POST", p.A.Server+"/api/v1/admin/os-images", bytes.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}).Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		p.t.Fatalf("registering the image through the previous release: %s: %s", resp.Status, b)
	}
}

// replicaB starts replica B from bin (same database and identity).
func (p *plane) replicaB(bin string) {
	p.t.Helper()
	var err error
	if p.B, err = p.A.Replica(p.ctx, bin, filepath.Join(p.dir, "b"), ctlFlags...); err != nil {
		p.t.Fatalf("start replica B: %v", err)
	}
	p.t.Cleanup(p.B.StopController)
	if p.tenant, err = client.New(client.Options{Server: p.A.Server + "," + p.B.Server, CAFile: p.A.CAFile, Token: p.A.Token}); err != nil {
		p.t.Fatal(err)
	}
	if p.admin, err = client.New(client.Options{Server: p.A.Server + "," + p.B.Server, CAFile: p.A.CAFile, Token: p.adminToken()}); err != nil {
		p.t.Fatal(err)
	}
}

func (p *plane) adminToken() string {
	b, _ := os.ReadFile(pki.Paths{Dir: p.A.StateDir}.AdminToken())
	return string(bytes.TrimSpace(b))
}

// upgrade replaces a replica's process with bin's on the same address (SIGTERM: drained).
func (p *plane) upgrade(e *benchenv.Env, bin string) {
	p.t.Helper()
	addr := e.Addr()
	e.StopController()
	if err := e.StartController(p.ctx, bin, append(append([]string(nil), ctlFlags...), "--listen", addr)...); err != nil {
		p.t.Fatalf("restart %s from %s: %v", addr, bin, err)
	}
}

// addHost registers a node with eight slots and enrolls and runs a sim hostd from bin.
func (p *plane) addHost(bin string) *host {
	p.t.Helper()
	n := len(p.hosts)
	h := &host{p: p, name: fmt.Sprintf("skew-%d", n), dir: filepath.Join(p.dir, "hosts", fmt.Sprint(n))}
	node, err := p.admin.CreateNode(p.ctx, apiv1.NodeCreate{Name: h.name, Region: "skew", SKU: "h200-sxm-baremetal-8g", SliceSKU: benchenv.SliceSKU})
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.admin.ApplySlots(p.ctx, h.name, apiv1.SlotApply{Slots: fixtures.H200SlotMap(n)}); err != nil {
		p.t.Fatal(err)
	}
	cfg := filepath.Join(h.dir, "hostd.yaml")
	servers := p.A.Server
	if p.B != nil {
		servers += "," + p.B.Server
	}
	out, err := exec.CommandContext(p.ctx, filepath.Join(bin, "gpuaas-hostd"), "enroll", "--server", servers, "--ca-file", p.A.CAFile,
		"--token", node.BootstrapToken, "--config", cfg, "--runtime", "sim", "--state-dir", filepath.Join(h.dir, "state")).CombinedOutput()
	if err != nil {
		p.t.Fatalf("enroll %s: %v\n%s", h.name, err, out)
	}
	h.args = []string{"run", "--config", cfg, "--poll-wait", "2s", "--heartbeat", "1s", "--sim-phase-delay", "50ms"}
	h.start(bin)
	p.t.Cleanup(h.stop)
	p.hosts = append(p.hosts, h)
	waitFor(p.t, h.name+"'s first heartbeat", 60*time.Second, func() (bool, error) {
		nd, err := p.admin.GetNode(p.ctx, h.name)
		return err == nil && nd.LastHeartbeatAt != nil, err
	})
	return h
}

func (h *host) start(bin string) {
	h.p.t.Helper()
	var err error
	if h.cmd, h.exited, err = benchenv.StartLogged(filepath.Join(h.dir, "hostd.log"), filepath.Join(bin, "gpuaas-hostd"), h.args...); err != nil {
		h.p.t.Fatal(err)
	}
}

func (h *host) stop() {
	if h.cmd == nil {
		return
	}
	benchenv.StopProcess(h.cmd.Process, h.exited)
	h.cmd = nil
}

// upgrade replaces the host's hostd with bin's (SIGTERM: it finishes what it runs first).
func (h *host) upgrade(bin string) {
	h.stop()
	h.start(bin)
}

// reports is what the host's last heartbeat said (agent version, task schemas).
func (p *plane) reports(h *host) (version string, schemas bool) {
	p.t.Helper()
	nd, err := p.admin.GetNode(p.ctx, h.name)
	if err != nil {
		p.t.Fatal(err)
	}
	var hb struct {
		AgentVersion string `json:"agent_version"`
		Facts        struct {
			TaskSchemas map[string][]int `json:"task_schemas"`
		} `json:"facts"`
	}
	_ = json.Unmarshal(nd.AgentFacts, &hb)
	return hb.AgentVersion, hb.Facts.TaskSchemas != nil
}

var startedRE = regexp.MustCompile(`msg="task started" task=([0-9a-f-]+)`)

// runs counts, from every host's own log, how many times each task was started.
func (p *plane) runs() map[string]int {
	out := map[string]int{}
	for _, h := range p.hosts {
		b, err := os.ReadFile(filepath.Join(h.dir, "hostd.log"))
		if err != nil {
			p.t.Fatal(err)
		}
		for _, m := range startedRE.FindAllSubmatch(b, -1) {
			out[string(m[1])]++
		}
	}
	return out
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lifecycle creates a one-GPU allocation through cl, waits for it to be active, releases
// it and waits for it to be released. Errors while a replica restarts are retried (a create
// with the same idempotency key, so a create whose answer was lost is not made twice).
func lifecycle(ctx context.Context, cl *client.Client, key string) (string, error) {
	retry := func(what string, f func() error) error {
		deadline := time.Now().Add(60 * time.Second)
		for {
			err := f()
			if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
				if err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				return nil
			}
			var ae *apiv1.Error
			if errors.As(err, &ae) && ae.Code != apiv1.CodeUnavailable && ae.Code != apiv1.CodeInternal {
				return fmt.Errorf("%s: %w", what, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	var id string
	if err := retry("create", func() error {
		a, err := cl.CreateAllocation(ctx, apiv1.AllocationCreate{SKU: benchenv.SliceSKU, GPUs: 1, Image: image}, key)
		if err == nil {
			id = a.ID
		}
		return err
	}); err != nil {
		return "", err
	}
	status := func(want string) error {
		return retry("wait "+want, func() error {
			a, err := cl.GetAllocation(ctx, id)
			if err != nil {
				return err
			}
			if a.Status == "failed" {
				return &apiv1.Error{Code: apiv1.CodeConflict, Message: "allocation " + id + " failed: " + a.FailureReason}
			}
			if a.Status != want {
				return &apiv1.Error{Code: apiv1.CodeUnavailable, Message: "allocation " + id + " is " + a.Status}
			}
			return nil
		})
	}
	if err := status("active"); err != nil {
		return id, err
	}
	if err := retry("release", func() error {
		_, err := cl.ReleaseAllocation(ctx, id)
		var ae *apiv1.Error
		if errors.As(err, &ae) && ae.Code == apiv1.CodeConflict { // already releasing (a retried release)
			return nil
		}
		return err
	}); err != nil {
		return id, err
	}
	return id, status("released")
}

// load runs workers that each repeat lifecycle until stopped, counting completions.
type load struct {
	done   atomic.Int64
	mu     sync.Mutex
	ids    []string
	errs   []error
	stop   context.CancelFunc
	wg     sync.WaitGroup
	prefix string
}

func (p *plane) startLoad(workers int) *load {
	ctx, cancel := context.WithCancel(p.ctx)
	l := &load{stop: cancel, prefix: fmt.Sprintf("skew-%d", time.Now().UnixNano())}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				id, err := lifecycle(ctx, p.tenant, fmt.Sprintf("%s-%d-%d", l.prefix, w, i))
				if ctx.Err() != nil && err != nil {
					return // stopped mid-lifecycle: finished below
				}
				l.mu.Lock()
				if id != "" {
					l.ids = append(l.ids, id)
				}
				if err != nil {
					l.errs = append(l.errs, err)
				}
				l.mu.Unlock()
				if err == nil {
					l.done.Add(1)
				}
			}
		}()
	}
	return l
}

// progress waits until n more lifecycles than now completed.
func (l *load) progress(t *testing.T, what string, n int64) {
	t.Helper()
	target := l.done.Load() + n
	waitFor(t, fmt.Sprintf("%d allocation lifecycles %s", n, what), 120*time.Second, func() (bool, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.errs) > 0 {
			t.Fatalf("allocation lifecycle failed %s: %v", what, l.errs)
		}
		return l.done.Load() >= target, nil
	})
}

func dumpLogs(t *testing.T, dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".log") || strings.HasSuffix(p, "postgres.log") {
			return nil
		}
		b, _ := os.ReadFile(p)
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		t.Logf("--- %s (tail)\n%s", p, b)
		return nil
	})
}
