package soak

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/bench/provision"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// phaseDelay is each simulated phase's length. The kill does not race it: each host runs
// with --sim-hold-phase set to its target phase, which never finishes once started, so the
// kill always lands in that phase however slow the machine (a 1-second window was missed
// once on a loaded CI box); the restarted daemon runs without the hold.
const phaseDelay = 100 * time.Millisecond

// TestKillHostdInEachPhase kills gpuaas-hostd with SIGKILL in each of the 17 provisioning
// phases and each of the 7 release phases, one host per phase, all at once (sim runtime:
// the host objects a lab VM would leave behind do not exist here, see docs/soak.md). Each
// task reported exactly the phases before the target when its host was killed; after the
// restart the controller redelivers it (lease expiry) and the host runs it again: every
// allocation ends active (then released), its task on a second attempt, every slot
// consistent throughout and available at the end.
func TestKillHostdInEachPhase(t *testing.T) {
	pgtest.RequireServer(t)
	if testing.Short() {
		t.Skip("kills 24 host daemons mid-task (-short)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := binaries(t)
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: workDir(t), BinDir: bin,
		ExtraFlags: []string{"--task-lease", "5s", "--provision-ttl", "5m"}})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	prov, rel := task.ProvisionPhases, task.ReleasePhases
	hosts := len(prov) + len(rel)
	fleet, err := provision.StartWith(ctx, env, bin, provision.Options{Hosts: hosts, Prefix: "phase", PhaseDelay: phaseDelay,
		Heartbeat: 2 * time.Second, Setup: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Stop()
	byName := map[string]int{}
	for i := 0; i < fleet.Len(); i++ {
		byName[fleet.Name(i)] = i
	}
	// Each host's first run after enrollment holds its target phase (provision phases for
	// the first hosts, release phases for the rest).
	for i := 0; i < hosts; i++ {
		if err := fleet.Kill(i); err != nil {
			t.Fatal(err)
		}
		if err := fleet.Restart(i, "--sim-hold-phase", phaseName(i, prov, rel, false)); err != nil {
			t.Fatal(err)
		}
	}
	tenant, err := env.Client()
	if err != nil {
		t.Fatal(err)
	}
	admin := fleet.Admin()
	checkInvariants := func(when string) {
		t.Helper()
		v, err := env.Store.InvariantsWithin(ctx, store.Deadlines{Provision: 5 * time.Minute})
		if err != nil || len(v) > 0 {
			t.Fatalf("%s: invariants: %v\n%s", when, err, strings.Join(v, "\n"))
		}
	}

	// Each allocation takes a whole 8-slot host, so each lands on its own host; allocs[i] is
	// the one on host i (whose daemon holds phaseName(i)).
	allocs := make([]*apiv1.Allocation, hosts)
	for i := range allocs {
		a, err := tenant.CreateAllocation(ctx, apiv1.AllocationCreate{SKU: benchenv.SliceSKU, GPUs: 8, Image: fleet.Image()}, "")
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if a, err = admin.GetAllocation(ctx, a.ID); err != nil { // the operator's view names the node
			t.Fatal(err)
		}
		h, ok := byName[a.NodeName]
		if !ok || allocs[h] != nil {
			t.Fatalf("allocation %s placed on %q: not a free host of this fleet", a.ID, a.NodeName)
		}
		allocs[h] = a
	}
	k := &killer{t: t, ctx: ctx, admin: admin, fleet: fleet, byName: byName}
	var wg sync.WaitGroup
	for i, a := range allocs[:len(prov)] {
		wg.Add(1)
		go func() { defer wg.Done(); k.killIn(a.ID, string(task.TypeVMProvision), prov, i) }()
	}
	for _, a := range allocs[len(prov):] { // provisioned undisturbed, killed while releasing
		wg.Add(1)
		go func() { defer wg.Done(); k.await(a.ID, "active") }()
	}
	wg.Wait()
	checkInvariants("after the provisioning kills")
	for i, a := range allocs {
		got := k.await(a.ID, "active")
		if got.Status != "active" {
			t.Errorf("allocation killed in %s: %s (%s), want active", phaseName(i, prov, rel, true), got.Status, got.FailureReason)
		}
		if i < len(prov) {
			k.wantRedelivered(a.ID, string(task.TypeVMProvision), prov[i])
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	for _, a := range allocs {
		if _, err := tenant.ReleaseAllocation(ctx, a.ID); err != nil {
			t.Fatalf("release %s: %v", a.ID, err)
		}
	}
	for j, a := range allocs[len(prov):] {
		wg.Add(1)
		go func() { defer wg.Done(); k.killIn(a.ID, string(task.TypeVMRelease), rel, j) }()
	}
	wg.Wait()
	for i, a := range allocs {
		if got := k.await(a.ID, "released"); got.Status != "released" {
			t.Errorf("allocation %s: %s (%s), want released", phaseName(i, prov, rel, true), got.Status, got.FailureReason)
		}
		if i >= len(prov) {
			k.wantRedelivered(a.ID, string(task.TypeVMRelease), rel[i-len(prov)])
		}
	}
	checkInvariants("after the release kills")
	if n, err := env.Int(ctx, `SELECT count(*) FROM node_resource_slots WHERE status <> 'available'`); err != nil || n != 0 {
		t.Fatalf("%d slots not available after every release (%v)", n, err)
	}
}

// phaseName is host i's target phase ("provision phase X" when long).
func phaseName(i int, prov, rel []string, long bool) string {
	kind, ph := "provision phase ", ""
	if i < len(prov) {
		ph = prov[i]
	} else {
		kind, ph = "release phase ", rel[i-len(prov)]
	}
	if long {
		return kind + ph
	}
	return ph
}

// killer kills a host while its task runs a chosen phase.
type killer struct {
	t      *testing.T
	ctx    context.Context
	admin  *client.Client
	fleet  *provision.Fleet
	byName map[string]int
}

// killIn waits until allocation id's task of type typ has reported exactly the phases before
// phases[k] as finished (so phases[k] is running), kills its host with SIGKILL and restarts it.
func (k *killer) killIn(id, typ string, phases []string, idx int) {
	t := k.t
	a, err := k.admin.GetAllocation(k.ctx, id)
	if err != nil {
		t.Errorf("%s: %v", id, err)
		return
	}
	host, ok := k.byName[a.NodeName]
	if !ok {
		t.Errorf("%s: on unknown node %q", id, a.NodeName)
		return
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		tk, err := k.task(id, typ)
		if err == nil && tk != nil && tk.Status == "leased" && tk.Attempt == 1 && finished(tk.Phases) == idx {
			break
		}
		if err == nil && tk != nil && (tk.Status != "queued" && tk.Status != "leased" || finished(tk.Phases) > idx) {
			t.Errorf("%s: missed phase %s: task %s attempt %d with %d phases finished", a.NodeName, phases[idx], tk.Status, tk.Attempt, finished(tk.Phases))
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %s never reached phase %s (%v)", a.NodeName, typ, phases[idx], err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := k.fleet.Kill(host); err != nil {
		t.Errorf("kill: %v", err)
		return
	}
	t.Logf("%s: kill -9 in %s phase %d/%d %s (%d finished)", a.NodeName, typ, idx+1, len(phases), phases[idx], idx)
	if err := k.fleet.Restart(host); err != nil {
		t.Errorf("restart: %v", err)
	}
}

// task is the allocation's task of type typ (nil until queued).
func (k *killer) task(id, typ string) (*apiv1.Task, error) {
	ts, err := k.admin.ListTasks(k.ctx, "", id)
	if err != nil {
		return nil, err
	}
	for _, tk := range ts {
		if tk.Type == typ {
			return k.admin.GetTask(k.ctx, tk.ID)
		}
	}
	return nil, nil
}

func finished(ph []apiv1.TaskPhase) int {
	n := 0
	for _, p := range ph {
		if p.Status != "running" {
			n++
		}
	}
	return n
}

// await polls until the allocation's status is want or it settled elsewhere (failed,
// released), with a deadline; the allocation as last read is returned.
func (k *killer) await(id, want string) *apiv1.Allocation {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		a, err := k.admin.GetAllocation(k.ctx, id)
		if err == nil && (a.Status == want || a.Status == "failed" || a.Status == "released") {
			return a
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("allocation %s not %s after 3 minutes (%v, last %+v)", id, want, err, a)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// wantRedelivered asserts the task succeeded on a later attempt with every phase done (the
// sim runtime's phases say simulated, never ok).
func (k *killer) wantRedelivered(id, typ, phase string) {
	tk, err := k.task(id, typ)
	if err != nil || tk == nil {
		k.t.Errorf("%s task of %s: %v", typ, id, err)
		return
	}
	want := len(task.PhasesOf(typ))
	if tk.Status != "succeeded" || tk.Attempt < 2 || finished(tk.Phases) != want {
		k.t.Errorf("killed in %s: task %s attempt %d with %d/%d phases, want succeeded on attempt >= 2", phase, tk.Status, tk.Attempt, finished(tk.Phases), want)
	}
	for _, p := range tk.Phases {
		if p.Status != "simulated" {
			k.t.Errorf("killed in %s: phase %s %s %s", phase, p.Name, p.Status, p.Error)
		}
	}
}
