package faults

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli"
	"github.com/gpuaas/gpuaas/internal/client"
)

// createN creates n one-GPU allocations through cl, one after another (concurrent creates
// on a one-node fleet would race for its slots), and returns their ids.
func createN(t *testing.T, c *cluster, cl *client.Client, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		a, err := cl.CreateAllocation(c.ctx, oneGPU(), fmt.Sprintf("%s-%d-%d", t.Name(), time.Now().UnixNano(), i))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = a.ID
	}
	return ids
}

// settled checks what every fault test promises for allocations that should end active:
// active, their provisioning task succeeded and run by the host exactly once (its own log),
// no result left in its spool, and the SQL invariants hold.
func (c *cluster) settled(h *host, cl *client.Client, ids []string) {
	c.t.Helper()
	for _, id := range ids {
		allocStatus(c.t, cl, id, 120*time.Second, "active")
	}
	runs := h.runs()
	for _, id := range ids {
		var prov []apiv1.Task
		for _, tk := range c.tasksOf(id) {
			if tk.Type == "slice.vm_provision" {
				prov = append(prov, tk)
			}
		}
		if len(prov) != 1 || prov[0].Status != "succeeded" {
			c.t.Fatalf("allocation %s: provisioning tasks %+v, want one succeeded", id, prov)
		}
		if n := runs[prov[0].ID]; n != 1 {
			c.t.Fatalf("task %s (allocation %s) started %d times on the host, want exactly 1", prov[0].ID, id, n)
		}
	}
	waitFor(c.t, "the host's result spool to drain", 60*time.Second, func() (bool, error) { return h.spooled() == 0, nil })
	c.checkInvariants()
}

// SIGKILL replica A while a host it serves runs tasks: the host fails over to B (listed in
// its config), its progress and results go there, and every task completes exactly once.
func TestFailoverToReplicaBAfterKill9(t *testing.T) {
	c := newCluster(t, 2, "--task-lease", "5s")
	h := c.addHost([]string{c.A.Server, c.B.Server}, "--sim-phase-delay", "250ms")
	viaB := c.tenant(c.B.Server)
	ids := createN(t, c, viaB, 4)
	for _, id := range ids {
		allocStatus(t, viaB, id, 60*time.Second, "provisioning")
	}
	if err := c.A.KillController(); err != nil {
		t.Fatal(err)
	}
	// New work after the kill reaches the host through B too.
	ids = append(ids, createN(t, c, viaB, 2)...)
	c.settled(h, viaB, ids)

	// gpuaasctl given both replicas (A first, dead) answers through B.
	tokFile := filepath.Join(c.dir, "tenant.token")
	if err := os.WriteFile(tokFile, []byte(c.A.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := cli.Main([]string{"--server", c.A.Server, "--server", c.B.Server, "--ca-file", c.A.CAFile, "--token-file", tokFile,
		"alloc", "list", "-o", "json"}, strings.NewReader(""), &out, &errOut)
	if code != 0 {
		t.Fatalf("gpuaasctl with a dead first replica: exit %d: %s", code, errOut.String())
	}
	for _, id := range ids {
		if !strings.Contains(out.String(), id) {
			t.Fatalf("gpuaasctl alloc list through B lacks %s:\n%s", id, out.String())
		}
	}
}

// SIGKILL the only controller at three moments, restarting it on the same address each
// time: while the host's polls are parked; right after a burst of creates (outbox dispatch
// and leases in flight); and while results are coming in (one allocation already active,
// the rest finishing, spooled while no controller answers). Nothing is lost, nothing runs
// twice, and spooled results are delivered once the controller is back.
func TestKill9ControllerDuringPollsDispatchAndResults(t *testing.T) {
	c := newCluster(t, 1, "--task-lease", "5s")
	h := c.addHost([]string{c.A.Server}, "--sim-phase-delay", "150ms")
	cl := c.tenant(c.A.Server)
	kill := func(when string) {
		t.Helper()
		if err := c.A.KillController(); err != nil {
			t.Fatalf("kill -9 %s: %v", when, err)
		}
	}

	// 1. During long polls: the host reconnects (with backoff) and takes new work.
	kill("during long polls")
	c.restartA()
	first := createN(t, c, cl, 1)
	c.settled(h, cl, first)

	// 2. During dispatch: the creates committed, their outbox events and leases in flight.
	burst := createN(t, c, cl, 2)
	kill("during dispatch")
	c.restartA()
	c.settled(h, cl, append(first, burst...))

	// 3. During result intake: the first result arrived, the others are on their way (or
	// still running, then spooled while no controller answers).
	more := createN(t, c, cl, 3)
	waitFor(t, "one of the burst to become active", 90*time.Second, func() (bool, error) {
		for _, id := range more {
			if a, err := cl.GetAllocation(c.ctx, id); err == nil && a.Status == "active" {
				return true, nil
			}
		}
		return false, nil
	})
	kill("during result intake")
	waitFor(t, "the host to finish what it runs", 60*time.Second, func() (bool, error) { return h.idle(), nil })
	c.restartA()
	done := append(append(first, burst...), more...)
	c.settled(h, cl, done)

	// 4. Mid-task: every result is spooled while no controller answers, then delivered.
	last := createN(t, c, cl, 2) // the host's eight slots are now all sold
	for _, id := range last {
		allocStatus(t, cl, id, 60*time.Second, "provisioning")
	}
	kill("mid-task")
	waitFor(t, "both results spooled", 60*time.Second, func() (bool, error) { return h.idle() && h.spooled() == len(last), nil })
	c.restartA()
	c.settled(h, cl, append(done, last...))
}
