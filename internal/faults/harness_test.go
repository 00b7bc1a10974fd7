package faults

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/agent"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/controller"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// binDir holds gpuaas-controller and gpuaas-hostd: links to this test binary, which runs
// the real daemon's Main when started under one of those names (as testscript does).
var binDir, workRoot string

func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case "gpuaas-controller":
		os.Exit(controller.Main("faults", os.Args[1:], os.Stdout, os.Stderr))
	case "gpuaas-hostd":
		os.Exit(agent.Main("faults", os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// As root, PostgreSQL runs as an unprivileged user: every directory above its data must
	// be traversable, which t.TempDir's 0700 directories are not.
	var err error
	if workRoot, err = os.MkdirTemp("", "gpuaas-faults-"); err == nil {
		err = os.Chmod(workRoot, 0o755)
	}
	exe, err2 := os.Executable()
	if err != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "faults:", err, err2)
		return 1
	}
	if os.Getenv("GPUAAS_FAULTS_KEEP") == "" { // keep the logs and data for a post-mortem
		defer os.RemoveAll(workRoot)
	}
	binDir = filepath.Join(workRoot, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		return 1
	}
	for _, name := range []string{"gpuaas-controller", "gpuaas-hostd"} {
		if err := os.Symlink(exe, filepath.Join(binDir, name)); err != nil {
			fmt.Fprintln(os.Stderr, "faults:", err)
			return 1
		}
	}
	return m.Run()
}

// cluster is one PostgreSQL with one or two controller replicas (A, and B if asked).
type cluster struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	A, B  *benchenv.Env
	flags []string // controller flags, kept for restarts
	admin *client.Client
	hosts int
}

var dirSeq atomic.Int32

// newCluster starts PostgreSQL and replica A (and B when replicas is 2) with flags.
//
// Fault tests run in parallel (up to -parallel, GOMAXPROCS by default): they mostly wait on
// leases, phases and restarts, and every one has its own PostgreSQL, processes and ports.
func newCluster(t *testing.T, replicas int, flags ...string) *cluster {
	t.Helper()
	pgtest.RequireServer(t)
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := filepath.Join(workRoot, fmt.Sprintf("%s-%d", t.Name(), dirSeq.Add(1)))
	c := &cluster{t: t, ctx: ctx, dir: dir, flags: flags}
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: dir, BinDir: binDir, ExtraFlags: flags})
	if err != nil {
		t.Fatalf("start PostgreSQL and replica A: %v", err)
	}
	c.A = env
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, dir)
		}
		env.Stop()
	})
	if replicas == 2 {
		if c.B, err = env.Replica(ctx, binDir, filepath.Join(dir, "b"), flags...); err != nil {
			t.Fatalf("start replica B: %v", err)
		}
		t.Cleanup(c.B.Stop)
	}
	tok, err := os.ReadFile(pki.Paths{Dir: env.StateDir}.AdminToken())
	if err != nil {
		t.Fatal(err)
	}
	servers := env.Server
	if c.B != nil {
		servers += "," + c.B.Server
	}
	if c.admin, err = client.New(client.Options{Server: servers, CAFile: env.CAFile, Token: string(bytes.TrimSpace(tok))}); err != nil {
		t.Fatal(err)
	}
	return c
}

// tenant is a tenant-token client talking to the given replicas (comma-joined URLs).
func (c *cluster) tenant(servers ...string) *client.Client {
	c.t.Helper()
	cl, err := client.New(client.Options{Server: strings.Join(servers, ","), CAFile: c.A.CAFile, Token: c.A.Token})
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// restartA starts replica A again on its old address (hosts configured with it come back).
func (c *cluster) restartA() {
	c.t.Helper()
	if err := c.A.StartController(c.ctx, binDir, append(append([]string(nil), c.flags...), "--listen", c.A.Addr())...); err != nil {
		c.t.Fatalf("restart replica A: %v", err)
	}
}

// host is one enrolled gpuaas-hostd process (sim runtime) with eight approved H200 slots.
type host struct {
	c      *cluster
	name   string
	id     string
	dir    string
	cfg    string
	args   []string
	cmd    *exec.Cmd
	exited <-chan error
}

// addHost registers a node with eight slots, enrolls a hostd against servers and starts it.
func (c *cluster) addHost(servers []string, runArgs ...string) *host {
	c.t.Helper()
	n := c.hosts
	c.hosts++
	h := &host{c: c, name: fmt.Sprintf("host-%d", n), dir: filepath.Join(c.dir, "hosts", fmt.Sprint(n))}
	node, err := c.admin.CreateNode(c.ctx, apiv1.NodeCreate{Name: h.name, Region: "bench", SKU: "h200-sxm-baremetal-8g", SliceSKU: benchenv.SliceSKU})
	if err != nil {
		c.t.Fatal(err)
	}
	h.id = node.ID
	if _, err := c.admin.ApplySlots(c.ctx, h.name, apiv1.SlotApply{Slots: fixtures.H200SlotMap(n)}); err != nil {
		c.t.Fatal(err)
	}
	h.cfg = filepath.Join(h.dir, "hostd.yaml")
	out, err := exec.CommandContext(c.ctx, filepath.Join(binDir, "gpuaas-hostd"), "enroll", "--server", strings.Join(servers, ","),
		"--ca-file", c.A.CAFile, "--token", node.BootstrapToken, "--config", h.cfg, "--runtime", "sim",
		"--state-dir", filepath.Join(h.dir, "state")).CombinedOutput()
	if err != nil {
		c.t.Fatalf("enroll %s: %v\n%s", h.name, err, out)
	}
	h.args = append([]string{"run", "--config", h.cfg, "--poll-wait", "2s", "--heartbeat", "1s"}, runArgs...)
	h.start()
	c.t.Cleanup(h.stop)
	waitFor(c.t, h.name+" heartbeat", 60*time.Second, func() (bool, error) {
		nd, err := c.admin.GetNode(c.ctx, h.name)
		return err == nil && nd.LastHeartbeatAt != nil, nil
	})
	return h
}

func (h *host) start() {
	h.c.t.Helper()
	var err error
	if h.cmd, h.exited, err = benchenv.StartLogged(filepath.Join(h.dir, "hostd.log"), filepath.Join(binDir, "gpuaas-hostd"), h.args...); err != nil {
		h.c.t.Fatal(err)
	}
}

func (h *host) stop() {
	if h.cmd == nil {
		return
	}
	benchenv.StopProcess(h.cmd.Process, h.exited)
	h.cmd = nil
}

var (
	startedRE  = regexp.MustCompile(`msg="task started" task=([0-9a-f-]+)`)
	finishedRE = regexp.MustCompile(`msg="task finished" task=([0-9a-f-]+)`)
)

// runs counts, from hostd's own log, how many times it started each task.
func (h *host) runs() map[string]int { return h.count(startedRE) }

// finished counts, from hostd's log, how many times each task finished.
func (h *host) finished() map[string]int { return h.count(finishedRE) }

func (h *host) count(re *regexp.Regexp) map[string]int {
	h.c.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.dir, "hostd.log"))
	if err != nil {
		h.c.t.Fatal(err)
	}
	out := map[string]int{}
	for _, m := range re.FindAllSubmatch(b, -1) {
		out[string(m[1])]++
	}
	return out
}

// idle reports whether every task the host started has finished.
func (h *host) idle() bool {
	s, f := h.runs(), h.finished()
	for id, n := range s {
		if f[id] != n {
			return false
		}
	}
	return true
}

// spooled is how many results hostd holds undelivered.
func (h *host) spooled() int {
	es, _ := os.ReadDir(filepath.Join(h.dir, "state", "spool"))
	n := 0
	for _, e := range es {
		if strings.HasSuffix(e.Name(), ".json") {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds or timeout passes (no fixed sleeps: the deadline is
// generous, the loop ends as soon as the condition holds).
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

// allocStatus waits until allocation id reaches one of want (read through cl) and returns it.
func allocStatus(t *testing.T, cl *client.Client, id string, timeout time.Duration, want ...string) string {
	t.Helper()
	var got string
	waitFor(t, fmt.Sprintf("allocation %s to become %v", id, want), timeout, func() (bool, error) {
		a, err := cl.GetAllocation(context.Background(), id)
		if err != nil {
			return false, err
		}
		got = a.Status
		for _, w := range want {
			if a.Status == w {
				return true, nil
			}
		}
		return false, fmt.Errorf("status %s", a.Status)
	})
	return got
}

// checkInvariants fails the test on any violated scheduler invariant (store.Invariants).
func (c *cluster) checkInvariants() {
	c.t.Helper()
	bad, err := c.A.Store.Invariants(c.ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(bad) > 0 {
		c.t.Fatalf("invariants violated:\n%s", strings.Join(bad, "\n"))
	}
}

// tasksOf returns the allocation's provisioning tasks as the tasks table has them.
func (c *cluster) tasksOf(alloc string) []apiv1.Task {
	c.t.Helper()
	ts, err := c.admin.ListTasks(c.ctx, "", alloc)
	if err != nil {
		c.t.Fatal(err)
	}
	return ts
}

func dumpLogs(t *testing.T, dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".log") || strings.HasSuffix(p, "postgres.log") {
			return nil
		}
		b, _ := os.ReadFile(p)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("--- %s (tail)\n%s", p, b)
		return nil
	})
}

// internalErrors returns the lines of dir's controller log that record an internal error
// (an answer of 500), each cut to 600 bytes, so a failing test names what went wrong even
// where only its own lines are kept (make failover prints only those).
func internalErrors(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "controller.log"))
	if err != nil {
		t.Fatalf("read the controller log: %v", err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `msg="internal error"`) {
			if len(line) > 600 {
				line = line[:600]
			}
			out = append(out, line)
		}
	}
	return out
}
