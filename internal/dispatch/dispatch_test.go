package dispatch_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, store.MigrateForTest)) }

type world struct {
	t      *testing.T
	ctx    context.Context
	st     *store.Store
	svc    *alloc.Service
	d      *dispatch.Dispatcher
	pub    ed25519.PublicKey
	node   apiv1.Node
	tenant alloc.Actor
	dbURL  string
}

func setup(t *testing.T, cfg dispatch.Config) *world {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	st, err := store.Open(ctx, url, store.Options{AllowSimulated: cfg.AllowSimulated, AllowUntestedImages: true}) // as the controller wires both
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	w := &world{t: t, ctx: ctx, st: st, svc: alloc.New(st, alloc.Config{}), pub: pub, dbURL: url}
	w.d = dispatch.New(st, w.svc, priv, nil, cfg)
	var tn apiv1.Tenant
	err = st.InTx(ctx, func(tx *store.Tx) error {
		if tn, err = tx.CreateTenant(ctx, "acme"); err != nil {
			return err
		}
		if _, err := tx.CreateImage(ctx, apiv1.OSImage{Slug: "img", DisplayName: "i", Version: "1", Target: "vm_slice", Family: "debian",
			Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://x/i", DigestSHA256: strings.Repeat("cd", 32),
			DefaultUsername: "d", DriverStrategy: "none", Active: true}); err != nil {
			return err
		}
		if w.node, err = tx.CreateNode(ctx, apiv1.NodeCreate{Name: "n1", Region: "lab", SliceSKU: "h200-sxm-slice"}); err != nil {
			return err
		}
		_, err = tx.ApplySlots(ctx, w.node.ID, fixtures.H200SlotMap(1), false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	w.tenant = alloc.Actor{TokenID: "t", Name: "acme", Role: "tenant", TenantID: tn.ID}
	return w
}

func (w *world) allocate(gpus int) apiv1.Allocation {
	w.t.Helper()
	a, _, err := w.svc.Create(w.ctx, w.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: gpus}, "")
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		w.t.Fatal(err)
	}
	return a
}

func (w *world) status(id string) string {
	w.t.Helper()
	a, err := w.svc.Get(w.ctx, alloc.Actor{Role: "admin"}, id)
	if err != nil {
		w.t.Fatal(err)
	}
	return a.Status
}

func (w *world) poll(wait time.Duration) *task.Envelope {
	w.t.Helper()
	env, err := w.d.Poll(w.ctx, w.node.ID, wait)
	if err != nil {
		w.t.Fatal(err)
	}
	return env
}

func TestProvisionTaskCarriesTheVerifiablePlan(t *testing.T) {
	w := setup(t, dispatch.Config{})
	a := w.allocate(2)
	env := w.poll(time.Second)
	if env == nil || env.Type != task.TypeVMProvision || env.Attempt != 1 {
		t.Fatalf("envelope = %+v", env)
	}
	v := &task.Verifier{Key: w.pub, NodeID: w.node.ID}
	p, err := v.Verify(env)
	if err != nil {
		t.Fatal(err)
	}
	plan := p.(*task.VMProvision)
	if plan.AllocationID != a.ID || len(plan.Bundles) != 2 || plan.Bundles[0].FabricVFPCI != "0000:1a:00.2" ||
		plan.Bundles[1].NVMeDevice == "" || plan.Profile.VCPUCount != 48 || plan.Image.DigestSHA256 == "" {
		t.Fatalf("plan = %+v", plan)
	}
	if st := w.status(a.ID); st != "provisioning" {
		t.Fatalf("allocation %s after lease, want provisioning", st)
	}
	// Nothing else is queued: the next poll waits out its time and returns nothing.
	if env := w.poll(50 * time.Millisecond); env != nil {
		t.Fatalf("second task delivered: %+v", env)
	}
}

func TestPollWakesOnNewTaskWithoutWaitingOut(t *testing.T) {
	w := setup(t, dispatch.Config{})
	got := make(chan *task.Envelope, 1)
	go func() {
		env, _ := w.d.Poll(w.ctx, w.node.ID, time.Minute)
		got <- env
	}()
	deadline := time.Now().Add(10 * time.Second)
	for w.d.Hub().Waiting(w.node.ID) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // until the poll is parked
	}
	w.allocate(1)
	select {
	case env := <-got:
		if env == nil || env.Type != task.TypeVMProvision {
			t.Fatalf("woken poll got %+v", env)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting poll was not woken by the new task (it would have waited a minute)")
	}
}

func TestLeaseExpiryRedeliversButNeverConcurrently(t *testing.T) {
	w := setup(t, dispatch.Config{Lease: time.Second})
	w.allocate(1)
	first := w.poll(time.Second)
	if first == nil {
		t.Fatal("no task")
	}
	// While the lease holds, nobody else gets the task.
	if env := w.poll(100 * time.Millisecond); env != nil {
		t.Fatalf("task delivered twice during its lease: attempt %d", env.Attempt)
	}
	// The host holding it dies; after the lease the task comes back with the next attempt.
	var again *task.Envelope
	deadline := time.Now().Add(15 * time.Second)
	for again == nil && time.Now().Before(deadline) {
		again = w.poll(200 * time.Millisecond)
	}
	if again == nil || again.TaskID != first.TaskID || again.Attempt != 2 {
		t.Fatalf("redelivery = %+v", again)
	}
}

func TestResultsDriveTheAllocationAndDuplicatesAreIdempotent(t *testing.T) {
	w, _, signer := signedSetup(t)
	a := w.allocate(1)
	env := w.poll(time.Second)
	res := task.Result{TaskID: env.TaskID, Attempt: 1, Status: "succeeded", Phases: []task.Phase{{Name: "lease_acquire", Status: "ok"}}}
	for i := 0; i < 2; i++ { // the second is a duplicate after a lost acknowledgement
		tr, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, res)
		if err != nil || tr.Status != "succeeded" {
			t.Fatalf("result %d: %+v %v", i, tr, err)
		}
	}
	if st := w.status(a.ID); st != "active" {
		t.Fatalf("allocation = %s", st)
	}
	// A different late result cannot rewrite the recorded one.
	if tr, _ := w.d.Result(w.ctx, w.node.ID, env.TaskID, task.Result{Status: "failed", Error: "late"}); tr.Status != "succeeded" {
		t.Fatalf("late result rewrote the task: %s", tr.Status)
	}
	// Another node cannot report on this task.
	if _, err := w.d.Result(w.ctx, "00000000-0000-0000-0000-000000000000", env.TaskID, res); err == nil {
		t.Fatal("another node reported a result")
	}
	// Release: the release task returns wipe proof for the slot.
	if _, err := w.svc.Release(w.ctx, w.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		t.Fatal(err)
	}
	rel := w.poll(time.Second)
	if rel == nil || rel.Type != task.TypeVMRelease {
		t.Fatalf("release task = %+v", rel)
	}
	p, err := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(rel)
	if err != nil {
		t.Fatal(err)
	}
	slot := p.(*task.VMRelease).Bundles[0].SlotID
	proof := signProof(t, signer, task.WipeProof{Verified: true, Method: "wipefs+blkdiscard-zeroout"}, slot, w.node.ID, rel.TaskID, a.ID)
	out, _ := json.Marshal(task.ReleaseOutput{Released: true, Wiped: map[string]task.WipeProof{slot: proof}})
	if _, err := w.d.Result(w.ctx, w.node.ID, rel.TaskID, task.Result{Status: "succeeded", Output: out}); err != nil {
		t.Fatal(err)
	}
	if st := w.status(a.ID); st != "released" {
		t.Fatalf("allocation after release = %s", st)
	}
	slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
	if slots[0].Status != "available" {
		t.Fatalf("slot after verified wipe = %s", slots[0].Status)
	}
}

func TestFailedProvisionFailsTheAllocation(t *testing.T) {
	w, _, signer := signedSetup(t)
	a := w.allocate(1)
	env := w.poll(time.Second)
	phases := []task.Phase{{Name: "image_fetch", StartedAt: time.Now().UTC().Truncate(time.Millisecond), DurationMS: 12, Status: "ok"},
		{Name: "image_digest_verify", StartedAt: time.Now().UTC().Truncate(time.Millisecond), DurationMS: 3, Status: "failed", Error: "sha256 mismatch"}}
	if _, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, task.Result{Status: "failed", Error: "image_digest_verify: sha256 mismatch", Phases: phases}); err != nil {
		t.Fatal(err)
	}
	got, _ := w.svc.Get(w.ctx, alloc.Actor{Role: "admin"}, a.ID)
	if got.Status != "failed" || !strings.Contains(got.FailureReason, "sha256 mismatch") {
		t.Fatalf("allocation = %s %q", got.Status, got.FailureReason)
	}
	// The allocation's view of its task: state, attempt, error and the host's phases.
	if len(got.Tasks) != 1 {
		t.Fatalf("allocation tasks = %+v, want the provisioning task", got.Tasks)
	}
	tv := got.Tasks[0]
	if tv.ID != env.TaskID || tv.Type != string(task.TypeVMProvision) || tv.Status != "failed" || tv.Attempt != 1 ||
		!strings.Contains(tv.Error, "sha256 mismatch") || tv.CreatedAt.IsZero() || len(tv.Phases) != 2 ||
		tv.Phases[1].Name != "image_digest_verify" || tv.Phases[1].Status != "failed" || tv.Phases[0].DurationMS != 12 {
		t.Fatalf("allocation's task view = %+v", tv)
	}
	slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
	if slots[0].Status != "failed" {
		t.Fatalf("touched slot = %s, want failed until cleaned", slots[0].Status)
	}
	// The failure starts a cleanup: a release-with-wipe task for the touched slot.
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		t.Fatal(err)
	}
	cl := w.poll(time.Second)
	if cl == nil || cl.Type != task.TypeVMRelease {
		t.Fatalf("cleanup task = %+v", cl)
	}
	p, _ := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(cl)
	slot := p.(*task.VMRelease).Bundles[0].SlotID
	proof := signProof(t, signer, task.WipeProof{Verified: true, Method: "wipefs+blkdiscard-zeroout"}, slot, w.node.ID, cl.TaskID, a.ID)
	out, _ := json.Marshal(task.ReleaseOutput{Wiped: map[string]task.WipeProof{slot: proof}})
	if _, err := w.d.Result(w.ctx, w.node.ID, cl.TaskID, task.Result{Status: "succeeded", Output: out}); err != nil {
		t.Fatal(err)
	}
	slots, _ = w.st.ListSlots(w.ctx, w.node.ID)
	if slots[0].Status != "available" || w.status(a.ID) != "failed" {
		t.Fatalf("after cleanup: slot %s, allocation %s", slots[0].Status, w.status(a.ID))
	}
}

func TestPlanInvalidBlocksTheSlotsWithoutAWipe(t *testing.T) {
	w := setup(t, dispatch.Config{})
	a := w.allocate(1)
	env := w.poll(time.Second)
	reason := "runtime_validate: plan_invalid: slot 0 disk /dev/disk/by-id/x: refused: /dev/loop3 is mounted (/mnt)"
	if _, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, task.Result{Status: "failed", Error: reason, Reason: "plan_invalid"}); err != nil {
		t.Fatal(err)
	}
	got, _ := w.svc.Get(w.ctx, alloc.Actor{Role: "admin"}, a.ID)
	// The only node refused: no re-placement is possible, so it fails with both reasons.
	if got.Status != "failed" || !strings.Contains(got.FailureReason, "plan_invalid") || !strings.Contains(got.FailureReason, "sku_unavailable: no other node") {
		t.Fatalf("allocation = %s %q", got.Status, got.FailureReason)
	}
	slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
	if slots[0].Status != "failed" {
		t.Fatalf("slot = %s, want failed (blocked until repaired)", slots[0].Status)
	}
	// No cleanup: wiping a disk the host says is mounted or leased elsewhere could destroy data.
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		t.Fatal(err)
	}
	if cl := w.poll(200 * time.Millisecond); cl != nil {
		t.Fatalf("a plan_invalid failure queued %s", cl.Type)
	}
}

func TestPlanInvalidPlacesTheAllocationOnAnotherNode(t *testing.T) {
	w := setup(t, dispatch.Config{})
	a := w.allocate(1)
	var n2 apiv1.Node
	err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
		var err error
		if n2, err = tx.CreateNode(w.ctx, apiv1.NodeCreate{Name: "n2", Region: "lab", SliceSKU: "h200-sxm-slice"}); err != nil {
			return err
		}
		_, err = tx.ApplySlots(w.ctx, n2.ID, fixtures.H200SlotMap(2), false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	env := w.poll(time.Second)
	refusal := task.Result{Status: "failed", Reason: "plan_invalid",
		Error: "lease_acquire: plan_invalid: lease held: device 0000:1b:00.0 is leased by allocation x"}
	if _, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, refusal); err != nil {
		t.Fatal(err)
	}
	got, _ := w.svc.Get(w.ctx, alloc.Actor{Role: "admin"}, a.ID)
	if got.Status != "requested" || got.NodeName != "n2" {
		t.Fatalf("after the refusal: %s on %s, want requested on n2", got.Status, got.NodeName)
	}
	// The refused slot is blocked with the host's reason; nothing was wiped.
	slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
	failed := 0
	for _, s := range slots {
		if s.Status == "failed" && strings.Contains(s.StatusReason, "lease held") {
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("refused slots: %d failed, want 1", failed)
	}
	// The new plan goes to n2 and carries only n2's slot.
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		t.Fatal(err)
	}
	env2, err := w.d.Poll(w.ctx, n2.ID, time.Second)
	if err != nil || env2 == nil || env2.Type != task.TypeVMProvision {
		t.Fatalf("n2 got %+v, %v", env2, err)
	}
	p, err := (&task.Verifier{Key: w.pub, NodeID: n2.ID}).Verify(env2)
	if err != nil {
		t.Fatal(err)
	}
	if b := p.(*task.VMProvision).Bundles; len(b) != 1 || b[0].GPUPCI == "" || strings.Contains(b[0].PrivateIP, "10.100.1.") {
		t.Fatalf("new plan bundles %+v", b)
	}
	if cl := w.poll(100 * time.Millisecond); cl != nil {
		t.Fatalf("the refusing node got another task: %s", cl.Type)
	}
	// A duplicate of the old refusal is stale: the new placement stands.
	if _, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, refusal); err != nil {
		t.Fatal(err)
	}
	if st := w.status(a.ID); st != "provisioning" {
		t.Fatalf("after a duplicate stale refusal: %s", st)
	}
	if _, err := w.d.Result(w.ctx, n2.ID, env2.TaskID, task.Result{Status: "succeeded"}); err != nil {
		t.Fatal(err)
	}
	if st := w.status(a.ID); st != "active" {
		t.Fatalf("after n2 succeeded: %s", st)
	}
}

func TestExpiredTaskFailsTheAllocation(t *testing.T) {
	w := setup(t, dispatch.Config{ProvisionTTL: time.Second})
	a := w.allocate(1)
	deadline := time.Now().Add(15 * time.Second)
	for w.status(a.ID) != "failed" && time.Now().Before(deadline) {
		if err := w.d.Reap(w.ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // until the 1s TTL passes
	}
	got, _ := w.svc.Get(w.ctx, alloc.Actor{Role: "admin"}, a.ID)
	if got.Status != "failed" || !strings.Contains(got.FailureReason, "deadline") {
		t.Fatalf("allocation = %s %q", got.Status, got.FailureReason)
	}
	// The never-provisioned slot is available again; the expired task is not delivered.
	if env := w.poll(50 * time.Millisecond); env != nil {
		t.Fatalf("expired task delivered: %+v", env)
	}
	slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
	if slots[0].Status != "available" {
		t.Fatalf("slot = %s", slots[0].Status)
	}
}

// A host long-polling replica A receives a task created through replica B: B queues the task
// in the create transaction and its notifier's NOTIFY (sent after commit, off the request
// path) reaches A's LISTEN relay, which wakes the waiting poll.
func TestCrossReplicaWakeUp(t *testing.T) {
	w := setup(t, dispatch.Config{OutboxEvery: time.Hour, ReapEvery: time.Hour})
	_, privB, _ := ed25519.GenerateKey(rand.Reader)
	svcB := alloc.New(w.st, alloc.Config{}) // each replica has its own service and dispatcher
	replicaB := dispatch.New(w.st, svcB, privB, nil, dispatch.Config{OutboxEvery: time.Hour, ReapEvery: time.Hour})
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	go w.d.Run(ctx) // replica A: LISTEN relay running; its outbox sweep is effectively off
	go replicaB.Run(ctx)
	got := make(chan *task.Envelope, 1)
	go func() {
		env, _ := w.d.Poll(ctx, w.node.ID, time.Minute)
		got <- env
	}()
	deadline := time.Now().Add(10 * time.Second)
	for w.d.Hub().Waiting(w.node.ID) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // until the poll is parked on A
	}
	select {
	case <-w.d.Listening():
	case <-time.After(10 * time.Second):
		t.Fatal("replica A never started listening")
	}
	a, _, err := svcB.Create(w.ctx, w.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, "")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case env := <-got:
		if env == nil || env.Type != task.TypeVMProvision || len(a.Tasks) != 1 || env.TaskID != a.Tasks[0].ID {
			t.Fatalf("poll on A got %+v; created with tasks %+v", env, a.Tasks)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("replica A's poll was not woken by replica B's task")
	}
}

// A slice allocation's provisioning task is queued by the create transaction itself: Create
// answers with it, a poll already parked on this replica is woken without the outbox worker,
// and the allocation.requested event is recorded already dispatched (no second task).
func TestCreateQueuesTheProvisioningTask(t *testing.T) {
	w := setup(t, dispatch.Config{OutboxEvery: time.Hour, ReapEvery: time.Hour}) // no Run: no outbox worker
	got := make(chan *task.Envelope, 1)
	go func() {
		env, _ := w.d.Poll(w.ctx, w.node.ID, 30*time.Second)
		got <- env
	}()
	deadline := time.Now().Add(10 * time.Second)
	for w.d.Hub().Waiting(w.node.ID) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // until the poll is parked
	}
	a := w.allocate(1)
	if len(a.Tasks) != 1 || a.Tasks[0].Type != string(task.TypeVMProvision) || a.Tasks[0].Status != "queued" {
		t.Fatalf("create answered with tasks %+v", a.Tasks)
	}
	select {
	case env := <-got:
		if env == nil || env.TaskID != a.Tasks[0].ID {
			t.Fatalf("parked poll got %+v", env)
		}
		if _, err := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(env); err != nil {
			t.Fatal(err)
		}
		var p task.VMProvision
		if err := json.Unmarshal(env.Payload, &p); err != nil || p.AllocationID != a.ID || len(p.Bundles) != 1 || p.Image.DigestSHA256 == "" {
			t.Fatalf("plan %+v, %v", p, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the parked poll was not woken by the create")
	}
	// The outbox worker makes no second provisioning task from the (dispatched) event.
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		t.Fatal(err)
	}
	if tasks, err := w.st.ListTasks(w.ctx, store.TaskFilter{AllocationID: a.ID}); err != nil || len(tasks) != 1 {
		t.Fatalf("tasks after the outbox ran: %+v, %v", tasks, err)
	}
}

// A slot blocked by an unverified wipe returns to service only through a verified repair wipe.
func TestRepairWipeReturnsBlockedSlot(t *testing.T) {
	w, _, signer := signedSetup(t)
	a := w.allocate(1)
	env := w.poll(time.Second)
	if _, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, task.Result{Status: "succeeded"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.Release(w.ctx, w.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		t.Fatal(err)
	}
	rel := w.poll(time.Second)
	// The host could not verify the wipe.
	out, _ := json.Marshal(task.ReleaseOutput{Wiped: map[string]task.WipeProof{}})
	if _, err := w.d.Result(w.ctx, w.node.ID, rel.TaskID, task.Result{Status: "failed", Output: out, Error: "wipe_verify: 1 non-zero region"}); err != nil {
		t.Fatal(err)
	}
	slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
	if slots[0].Status != "cleanup_blocked" {
		t.Fatalf("slot after failed wipe = %s", slots[0].Status)
	}
	repair := func(verified bool) string {
		id, err := w.d.QueueTask(w.ctx, w.node.ID, task.TypeWipeVerify, task.WipeVerify{SlotID: slots[0].ID, Device: slots[0].NVMeDevice, Apply: true}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		env := w.poll(time.Second)
		if env == nil || env.TaskID != id {
			t.Fatalf("repair task not delivered: %+v", env)
		}
		st := "succeeded"
		if !verified {
			st = "failed"
		}
		proof := signProof(t, signer, task.WipeProof{Verified: verified, Method: "wipefs+blkdiscard-zeroout"}, slots[0].ID, w.node.ID, id, "")
		out, _ := json.Marshal(map[string]any{"verified": verified, "method": "wipefs+blkdiscard-zeroout", "bytes": 1 << 30, "proof": proof})
		if _, err := w.d.Result(w.ctx, w.node.ID, id, task.Result{Status: st, Output: out}); err != nil {
			t.Fatal(err)
		}
		got, _ := w.st.ListSlots(w.ctx, w.node.ID)
		return got[0].Status
	}
	if st := repair(false); st != "cleanup_blocked" {
		t.Fatalf("after unverified repair: %s", st)
	}
	if st := repair(true); st != "available" {
		t.Fatalf("after verified repair: %s", st)
	}
}

// A poll with free task slots leases a burst of tasks at once, oldest first, never more than
// asked and never one task twice.
func TestPollManyLeasesABurst(t *testing.T) {
	w := setup(t, dispatch.Config{})
	for range 3 {
		if _, _, err := w.svc.Create(w.ctx, w.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, ""); err != nil {
			t.Fatal(err)
		}
	}
	first, err := w.d.PollMany(w.ctx, w.node.ID, time.Second, 2)
	if err != nil || len(first) != 2 {
		t.Fatalf("first poll: %d tasks, %v", len(first), err)
	}
	rest, err := w.d.PollMany(w.ctx, w.node.ID, time.Second, 5)
	if err != nil || len(rest) != 1 {
		t.Fatalf("second poll: %d tasks, %v", len(rest), err)
	}
	seen := map[string]bool{}
	for _, env := range append(first, rest...) {
		_, verr := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(env)
		if seen[env.TaskID] || env.Type != task.TypeVMProvision || verr != nil {
			t.Fatalf("task %s: duplicate %v, type %s, verify %v", env.TaskID, seen[env.TaskID], env.Type, verr)
		}
		seen[env.TaskID] = true
	}
	if none, err := w.d.PollMany(w.ctx, w.node.ID, 50*time.Millisecond, 4); err != nil || len(none) != 0 {
		t.Fatalf("empty poll: %d tasks, %v", len(none), err)
	}
}

// An allocation released before its host took the provision task never reaches the host:
// released before dispatch, no task is queued; released after, the queued task is cancelled;
// released after the host leased it (but before provisioning was recorded), the release goes
// through the host with a wipe instead of returning the slots at once.
func TestReleasedBeforeTheHostTookItIsNeverProvisioned(t *testing.T) {
	w := setup(t, dispatch.Config{})
	admin := alloc.Actor{Role: "admin", Name: "admin", TokenID: "a"}
	release := func(id string) apiv1.Allocation {
		a, err := w.svc.Release(w.ctx, w.tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	// 1. Released before the outbox worker ran (a service without a task planner: its task
	// comes from the outbox, as a re-placement's does).
	outboxOnly := alloc.New(w.st, alloc.Config{})
	a1, _, err := outboxOnly.Create(w.ctx, w.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := release(a1.ID); got.Status != "released" {
		t.Fatalf("cancelled before dispatch: %s", got.Status)
	}
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		t.Fatal(err)
	}
	if env := w.poll(50 * time.Millisecond); env != nil {
		t.Fatalf("a released allocation's task was delivered: %s %s", env.Type, env.TaskID)
	}
	// 2. Released with its task queued.
	a2 := w.allocate(1)
	if got := release(a2.ID); got.Status != "released" {
		t.Fatalf("cancelled with a queued task: %s", got.Status)
	}
	if env := w.poll(50 * time.Millisecond); env != nil {
		t.Fatalf("a cancelled task was delivered: %s", env.Type)
	}
	tasks, err := w.st.ListTasks(w.ctx, store.TaskFilter{AllocationID: a2.ID})
	if err != nil || len(tasks) != 1 || tasks[0].Status != "cancelled" {
		t.Fatalf("queued task after release: %+v %v", tasks, err)
	}
	// 3. Released after the host leased the task, before provisioning was recorded.
	a3 := w.allocate(1)
	if _, err := w.st.LeaseTask(w.ctx, w.node.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := release(a3.ID); got.Status != "releasing" {
		t.Fatalf("released after the host took the plan: %s, want releasing (wipe through the host)", got.Status)
	}
	full, err := w.svc.Get(w.ctx, admin, a3.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range full.Claims {
		if c.Status != "releasing" {
			t.Fatalf("claim %s is %s, want releasing until the wipe proof", c.SlotID, c.Status)
		}
	}
}

// A create and a release before provisioning answer from their own transaction's batch, not
// from a Get after it. Both answers must be exactly what Get reads afterwards: the create's
// with its provisioning task (alloc.TestCreateAnswerMatchesARead has no task planner), the
// release's including a claim a re-placement had already released and a task that had
// already ended.
func TestCreateAndReleaseAnswerWhatGetReads(t *testing.T) {
	w := setup(t, dispatch.Config{})
	admin := alloc.Actor{Role: "admin", Name: "admin", TokenID: "a"} // sees every field
	same := func(what string, got apiv1.Allocation) {
		t.Helper()
		want, err := w.svc.Get(w.ctx, admin, got.ID)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := json.Marshal(got)
		wj, _ := json.Marshal(want)
		if string(g) != string(wj) {
			t.Fatalf("%s answered\n%s\nGet reads\n%s", what, g, wj)
		}
	}
	a, _, err := w.svc.Create(w.ctx, admin, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2, TenantID: w.tenant.TenantID}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Claims) != 2 || len(a.Tasks) != 1 || a.Tasks[0].Status != "queued" || a.NodeName != "n1" || a.Region != "lab" {
		t.Fatalf("create answered %d claims, tasks %+v, node %q, region %q", len(a.Claims), a.Tasks, a.NodeName, a.Region)
	}
	same("create", a)
	// A claim given up by a re-placement and a task that already failed stay as they were;
	// the live claim is released and the queued task cancelled.
	conn, err := pgx.Connect(w.ctx, w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE allocation_resource_claims SET status = 'released', released_at = now() WHERE id = $1::uuid`, []any{a.Claims[0].ID}},
		{`UPDATE node_resource_slots SET status = 'available' WHERE id = $1::uuid`, []any{a.Claims[0].SlotID}},
		{`INSERT INTO node_tasks (node_id, allocation_id, type, payload, not_after, status, error, created_at)
			VALUES ($1::uuid, $2::uuid, 'slice.vm_provision', '{}', now() + interval '1 hour', 'failed', 'an earlier attempt',
				now() - interval '1 minute')`, []any{w.node.ID, a.ID}},
	} {
		if _, err := conn.Exec(w.ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	rel, err := w.svc.Release(w.ctx, admin, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	byStatus := map[string]int{}
	for _, c := range rel.Claims {
		byStatus["claim "+c.Status]++
	}
	for _, tr := range rel.Tasks {
		byStatus["task "+tr.Status]++
	}
	if rel.Status != "released" || rel.ReleasedAt == nil || byStatus["claim released"] != 2 || byStatus["task cancelled"] != 1 || byStatus["task failed"] != 1 {
		t.Fatalf("release answered %s, released_at %v, %v", rel.Status, rel.ReleasedAt, byStatus)
	}
	same("release", rel)
}

// A succeeded discovery or reconcile whose report is missing or malformed is refused (400)
// and not recorded, so the host can send a corrected result; a valid one is then accepted.
func TestUnreadableReportIsRefusedNotRecorded(t *testing.T) {
	w := setup(t, dispatch.Config{})
	id, err := w.d.QueueReconcile(w.ctx, w.node.ID)
	if err != nil {
		t.Fatal(err)
	}
	if env := w.poll(time.Second); env == nil || env.TaskID != id {
		t.Fatalf("reconcile task not delivered: %+v", env)
	}
	for _, out := range []json.RawMessage{nil, json.RawMessage("null"), json.RawMessage(`[1,2]`), json.RawMessage(`{"slots": 7}`)} {
		_, err := w.d.Result(w.ctx, w.node.ID, id, task.Result{Status: "succeeded", Output: out})
		var ae *apiv1.Error
		if !errors.As(err, &ae) || ae.Code != apiv1.CodeInvalidRequest {
			t.Fatalf("output %q: err %v, want invalid_request", out, err)
		}
		tr, err := w.st.GetTask(w.ctx, id)
		if err != nil || tr.Status != "leased" {
			t.Fatalf("output %q: task %s after a refused result (%v), want still leased", out, tr.Status, err)
		}
	}
	if tr, err := w.d.Result(w.ctx, w.node.ID, id, task.Result{Status: "succeeded", Output: json.RawMessage(`{"slots": []}`)}); err != nil || tr.Status != "succeeded" {
		t.Fatalf("valid report: %s, %v", tr.Status, err)
	}
}

// Wake-ups for other replicas are paced: after one NOTIFY, the nodes woken within
// NotifyEvery go out together in the next, no sooner than NotifyEvery after the first.
func TestReplicaWakeupsArePaced(t *testing.T) {
	const every = 300 * time.Millisecond
	w := setup(t, dispatch.Config{NotifyEvery: every})
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	got := make(chan string, 16)
	ready := make(chan struct{})
	go w.st.Listen(ctx, dispatch.NotifyChannel, func(p string) { got <- p }, func(error) {}, func() { close(ready) })
	<-ready
	go w.d.Run(ctx)
	next := func() (string, time.Time) {
		select {
		case p := <-got:
			return p, time.Now()
		case <-time.After(30 * time.Second):
			t.Fatal("no NOTIFY within 30 s")
			return "", time.Time{}
		}
	}
	start := time.Now() // before the first NOTIFY is sent, so before the pacing clock starts
	w.d.TaskQueued("node-a")
	if p, _ := next(); p != "node-a" {
		t.Fatalf("first NOTIFY = %q, want node-a at once", p)
	}
	for _, n := range []string{"node-b", "node-c", "node-d"} {
		w.d.TaskQueued(n)
	}
	p, at := next()
	if p != "node-b,node-c,node-d" {
		t.Fatalf("second NOTIFY = %q, want the three nodes woken since the first in one", p)
	}
	if gap := at.Sub(start); gap < every { // a lower bound: a slow machine only makes it later
		t.Fatalf("second NOTIFY came %v after the first was asked for, want >= %v", gap, every)
	}
}

// The running dispatcher brings the best-fit hint (nodes.available_slots) up to date after
// allocations take and give back slots: reservations never write the node row themselves.
func TestCapacityHintFollowsAllocations(t *testing.T) {
	w := setup(t, dispatch.Config{})
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	conn, err := pgx.Connect(ctx, w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	waitHint := func(want int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second) // a guard against a hang, not a timing assertion
		var got int
		for time.Now().Before(deadline) {
			if err := conn.QueryRow(ctx, `SELECT available_slots FROM nodes WHERE id = $1`, w.node.ID).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got == want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("hint %d, want %d", got, want)
	}
	waitHint(8) // the applied slot map set it at once
	go w.d.Run(ctx)
	a := w.allocate(4)
	waitHint(4)
	if _, err := w.svc.Release(w.ctx, w.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	waitHint(8)
}
