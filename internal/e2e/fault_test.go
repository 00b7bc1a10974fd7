package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gpuaas/gpuaas/internal/task"
)

// libvirtSocket is where libvirtd listens (.ci/run starts it).
const libvirtSocket = "/run/libvirt/libvirt-sock"

// relay is a Unix socket in front of libvirtd's, so one script can take "libvirtd" away
// from its hostd (libvirtdown) while libvirtd keeps serving the scripts running beside it.
// To hostd it is libvirtd: the same protocol, byte for byte, until the socket goes dead.
type relay struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

var (
	relaysMu sync.Mutex
	relays   = map[*testscript.TestScript]*relay{}
)

// libvirtRelay starts the relay in $WORK and sets VAR to its path.
// Usage: libvirtrelay VAR
func libvirtRelay(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: libvirtrelay VAR")
	}
	path := ts.MkAbs("libvirt-relay.sock")
	ln, err := net.Listen("unix", path)
	ts.Check(err)
	r := &relay{ln: ln}
	relaysMu.Lock()
	relays[ts] = r
	relaysMu.Unlock()
	ts.Defer(func() {
		r.stop()
		relaysMu.Lock()
		delete(relays, ts)
		relaysMu.Unlock()
	})
	go r.serve()
	ts.Setenv(args[0], path)
}

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("unix", libvirtSocket)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		if r.down {
			r.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

// stop closes the listener and every relayed connection: libvirtd is gone for this script.
func (r *relay) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = true
	_ = r.ln.Close()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// libvirtDown takes this script's libvirtd away (see libvirtrelay). Usage: libvirtdown
func libvirtDown(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: libvirtdown")
	}
	relaysMu.Lock()
	r := relays[ts]
	relaysMu.Unlock()
	if r == nil {
		ts.Fatalf("libvirtdown: no libvirtrelay in this script")
	}
	r.stop()
}

// waitPhase waits until the allocation's slice.vm_provision task, on the given attempt, has
// reported PHASE finished (the next phase is running or about to), so a kill lands after it. Usage: waitphase ALLOC PHASE ATTEMPT [timeout]
func waitPhase(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 3 {
		ts.Fatalf("usage: waitphase ALLOC PHASE ATTEMPT [timeout]")
	}
	attempt, err := strconv.Atoi(args[2])
	ts.Check(err)
	timeout := 5 * time.Minute
	if len(args) == 4 {
		timeout, err = time.ParseDuration(args[3])
		ts.Check(err)
	}
	c := scriptClient(ts)
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	last := "no task"
	for time.Now().Before(deadline) {
		tasks, err := c.ListTasks(ctx, "", args[0])
		ts.Check(err)
		for _, t := range tasks {
			if t.Type != string(task.TypeVMProvision) {
				continue
			}
			full, err := c.GetTask(ctx, t.ID)
			ts.Check(err)
			now := fmt.Sprintf("task %s attempt %d, %d phases", full.Status, full.Attempt, len(full.Phases))
			if now != last {
				ts.Logf("waitphase %s: %s", args[0], now)
			}
			last = now
			if full.Status != "queued" && full.Status != "leased" || full.Attempt > attempt {
				ts.Fatalf("waitphase %s: the task moved on before %s of attempt %d (%s)", args[0], args[1], attempt, last)
			}
			for _, p := range full.Phases {
				if full.Attempt == attempt && p.Name == args[1] && p.Status != "running" {
					ts.Logf("%s: %s %s on attempt %d (%s)", args[0], args[1], p.Status, attempt, p.Detail)
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond) // progress poll; the deadline bounds it
	}
	ts.Fatalf("waitphase %s %s attempt %d: not reached in %s (%s)", args[0], args[1], attempt, timeout, last)
}
