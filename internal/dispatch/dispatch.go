package dispatch

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cpuset"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/topology"
)

// NotifyChannel is the PostgreSQL channel carrying node ids with new tasks.
const NotifyChannel = "gpuaas_node_tasks"

// Config tunes dispatch.
type Config struct {
	ProvisionTTL time.Duration // seed 003: 20 minutes
	// ImageKeys are the trusted image publisher keys, sent in the provisioning task of an
	// image whose SKU requires signed images (the host verifies the signature with them).
	ImageKeys   []imagesig.Key
	ReleaseTTL  time.Duration
	Lease       time.Duration // visibility timeout of a leased task
	ReapEvery   time.Duration
	OutboxEvery time.Duration // fallback sweep; commits wake the worker at once
	// ReconcileEvery queues slice.reconcile on every reachable node this often (0: never;
	// operators can still ask with POST .../reconcile). ReconcileMaxAge is the heartbeat age
	// that counts as reachable.
	ReconcileEvery  time.Duration
	ReconcileMaxAge time.Duration
	// NoReplicaWakeups skips the PostgreSQL NOTIFY that wakes long polls held by other
	// controller replicas (a single-replica deployment; those polls then find their task when
	// their wait ends). Polls on this replica are always woken in process.
	NoReplicaWakeups bool
	// NotifyEvery paces those NOTIFYs: at most one per interval, each naming every node woken
	// since the last (default 20 ms). Each NOTIFY is a transaction with its own commit; sent
	// as soon as the notifier was free, a busy replica sent about one per create.
	NotifyEvery time.Duration
	// AllowSimulated accepts results of the sim runtime (no VM, no disk written) as an
	// allocation's provisioning and its slots' wipes. Without it a simulated provisioning
	// fails the allocation and a simulated wipe leaves its slot cleanup_blocked; the database
	// refuses the slot's return to sale too (migration 016).
	AllowSimulated bool
	// NodeCA holds the CA certificate(s) that issue node certificates: hosts' wipe proofs are
	// checked against their signer's certificate, and it against these (nil: no proof counts).
	NodeCA *x509.CertPool
	// ReapplyAfter is how long a recorded provisioning or release result may leave its
	// allocation unmoved before the reaper applies it again (default 30 s; the result's own
	// request applies it at once, and the host retries a request that failed).
	ReapplyAfter time.Duration
}

func (c *Config) defaults() {
	if c.ProvisionTTL == 0 {
		c.ProvisionTTL = 20 * time.Minute
	}
	if c.ReleaseTTL == 0 {
		c.ReleaseTTL = 30 * time.Minute
	}
	if c.Lease == 0 {
		c.Lease = 2 * time.Minute
	}
	if c.ReapEvery == 0 {
		c.ReapEvery = 5 * time.Second
	}
	if c.OutboxEvery == 0 {
		c.OutboxEvery = 2 * time.Second
	}
	if c.ReapplyAfter == 0 {
		c.ReapplyAfter = 30 * time.Second
	}
	if c.NotifyEvery == 0 {
		c.NotifyEvery = 20 * time.Millisecond
	}
}

// Dispatcher owns node tasks.
type Dispatcher struct {
	st    *store.Store
	alloc *alloc.Service
	key   ed25519.PrivateKey
	hub   *Hub
	log   *slog.Logger
	cfg   Config
	kick  chan struct{}
	now   func() time.Time

	listenOnce sync.Once
	listening  chan struct{}

	// Nodes whose polls other replicas must wake (TaskQueued), sent by notifyLoop.
	notifyMu      sync.Mutex
	notifyPending []string
	notifyWake    chan struct{}
}

// New returns a Dispatcher; Run starts its workers.
func New(st *store.Store, svc *alloc.Service, key ed25519.PrivateKey, log *slog.Logger, cfg Config) *Dispatcher {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	d := &Dispatcher{st: st, alloc: svc, key: key, hub: NewHub(), log: log, cfg: cfg, kick: make(chan struct{}, 1), now: time.Now,
		listening: make(chan struct{}), notifyWake: make(chan struct{}, 1)}
	if svc != nil {
		svc.SetTaskPlanner(d)
	}
	return d
}

// ProvisionTask builds the provisioning task of a slice allocation being created (see
// alloc.TaskPlanner): the same task the outbox worker would make from the committed plan.
func (d *Dispatcher) ProvisionTask(plan store.DispatchInfo) (*store.NewTask, error) {
	return d.taskFor(store.OutboxEvent{Topic: "allocation.requested", AggregateID: plan.ID, NodeID: plan.NodeID}, plan)
}

// TaskQueued wakes node's polls on this replica at once and, through notifyLoop (never on
// the caller's path), on the other replicas.
func (d *Dispatcher) TaskQueued(node string) {
	d.hub.Wake(node)
	if d.cfg.NoReplicaWakeups {
		return
	}
	d.notifyMu.Lock()
	if !slices.Contains(d.notifyPending, node) && len(d.notifyPending) < maxNotifyPending {
		d.notifyPending = append(d.notifyPending, node)
	}
	d.notifyMu.Unlock()
	select {
	case d.notifyWake <- struct{}{}:
	default:
	}
}

// maxNotifyPending bounds the nodes waiting for a NOTIFY (a replica whose notifier is stuck
// must not grow without bound; other replicas' polls find their tasks when their wait ends).
// notifyChunk keeps a payload (36-byte ids and commas) under PostgreSQL's 8000-byte limit.
const (
	maxNotifyPending = 10000
	notifyChunk      = 200
)

// notifyLoop sends the wake-ups TaskQueued collected, one NOTIFY per chunk of nodes and at
// most one round of them per Config.NotifyEvery, so a stream of creates costs a few
// notifications a second instead of one transaction each; another replica's poll learns of
// its task at most NotifyEvery late (the fan-out target is 100 ms at p99).
func (d *Dispatcher) notifyLoop(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.notifyWake:
		}
		if wait := d.cfg.NotifyEvery - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		d.notifyMu.Lock()
		nodes := d.notifyPending
		d.notifyPending = nil
		d.notifyMu.Unlock()
		for len(nodes) > 0 {
			n := min(len(nodes), notifyChunk)
			if err := d.st.Notify(ctx, NotifyChannel, strings.Join(nodes[:n], ",")); err != nil && ctx.Err() == nil {
				d.log.Warn("notify", "nodes", n, "err", err)
			}
			nodes = nodes[n:]
		}
	}
}

// Hub exposes the wake-up hub.
func (d *Dispatcher) Hub() *Hub { return d.hub }

// Listening is closed once this replica receives other replicas' task notifications.
func (d *Dispatcher) Listening() <-chan struct{} { return d.listening }

// Kick asks the outbox worker to run now (call after committing an allocation change).
func (d *Dispatcher) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run runs the LISTEN relay, the outbox worker and the reaper until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) {
	var interrupted bool // only the Listen goroutine touches it
	go d.st.Listen(ctx, NotifyChannel, d.wakeFromNotify,
		func(err error) {
			interrupted = true
			d.log.Warn("task notifications interrupted; reconnecting", "err", err)
		},
		func() {
			if interrupted {
				// NOTIFYs sent while this replica was not listening are gone (PostgreSQL
				// keeps none for absent listeners): every waiting poll looks again.
				d.hub.WakeAll()
				d.log.Info("task notifications restored; waking every waiting poll")
			}
			d.listenOnce.Do(func() { close(d.listening) })
		})
	if d.cfg.ReconcileEvery > 0 {
		go d.reconcileLoop(ctx)
	}
	go d.capacityLoop(ctx)
	go d.notifyLoop(ctx)
	reap := time.NewTicker(d.cfg.ReapEvery)
	sweep := time.NewTicker(d.cfg.OutboxEvery)
	defer reap.Stop()
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
			d.drainOutbox(ctx)
		case <-sweep.C:
			d.drainOutbox(ctx)
		case <-reap.C:
			if err := d.Reap(ctx); err != nil && ctx.Err() == nil {
				d.log.Error("reaper", "err", err)
			}
			d.expireReservations(ctx)
		}
	}
}

// The best-fit capacity hint (store.RefreshCapacity) is brought up to date capacityBusy after
// a refresh that changed a node, capacityIdle after one that changed none. Placement is exact
// either way; the hint only orders the windows it reads, and a stale one costs reads: nodes the
// hint still shows half free but concurrent creates have filled come first and yield nothing,
// so the create reads another window. 64 clients, 500 nodes: windows read per create 1.70
// with a 250 ms cadence, 1.37 at 50 ms, 1.15 at 20 ms, 1.09 at 10 ms, while the refreshes
// themselves grew from 0.1 to 0.2 ms of PostgreSQL time per create+release pair and the pairs
// per second rose (docs/performance.md). An idle controller refreshes four times a second.
const (
	capacityBusy = 10 * time.Millisecond
	capacityIdle = 250 * time.Millisecond
)

// capacityWait is the wait before the next refresh after one that changed changed nodes.
func capacityWait(changed int) time.Duration {
	if changed > 0 {
		return capacityBusy
	}
	return capacityIdle
}

func (d *Dispatcher) capacityLoop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := d.st.RefreshCapacity(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("capacity hint refresh", "err", err)
		}
		t.Reset(capacityWait(changed))
	}
}

// outboxBatch is how many events one outbox transaction turns into tasks: small, because the
// hosts are woken only when it commits (a burst of allocations reaches its hosts in steps of
// this size instead of all at the end of one long transaction).
const outboxBatch = 8

func (d *Dispatcher) drainOutbox(ctx context.Context) {
	for ctx.Err() == nil {
		n, err := d.ProcessOutbox(ctx, outboxBatch)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Error("outbox", "err", err)
			}
			return
		}
		if n == 0 {
			return
		}
	}
}

// ProcessOutbox turns up to limit pending outbox events into node tasks in one transaction
// (a fixed number of round trips, whatever the batch), then (after commit) wakes the nodes'
// polls here and on every replica. Returns events handled.
func (d *Dispatcher) ProcessOutbox(ctx context.Context, limit int) (int, error) {
	var nodes []string
	var handled int
	err := d.st.InTx(ctx, func(tx *store.Tx) error {
		nodes, handled = nil, 0
		evs, err := tx.PendingOutbox(ctx, limit)
		if err != nil || len(evs) == 0 {
			return err
		}
		var want []string
		for _, ev := range evs {
			if needsTask(ev) {
				want = append(want, ev.AggregateID)
			}
		}
		infos, err := tx.DispatchInfos(ctx, want)
		if err != nil {
			return err
		}
		var tasks []store.NewTask
		ids := make([]int64, 0, len(evs))
		for _, ev := range evs {
			if needsTask(ev) {
				info, ok := infos[ev.AggregateID]
				if !ok {
					return fmt.Errorf("outbox %d (%s): allocation %s: %w", ev.ID, ev.Topic, ev.AggregateID, store.ErrNotFound)
				}
				nt, err := d.taskFor(ev, info)
				if err != nil {
					return fmt.Errorf("outbox %d (%s): %w", ev.ID, ev.Topic, err)
				}
				if nt != nil {
					tasks = append(tasks, *nt)
					if !slices.Contains(nodes, nt.NodeID) {
						nodes = append(nodes, nt.NodeID)
					}
				}
			}
			ids = append(ids, ev.ID)
			handled++
		}
		return tx.QueueTasks(ctx, tasks, ids)
	})
	if err != nil {
		return 0, err
	}
	if len(nodes) > 0 {
		d.wake(ctx, nodes...)
	}
	return handled, nil
}

// wake signals this replica's polls for the nodes at once and, through one NOTIFY (payload:
// comma-separated node ids), the other replicas'.
func (d *Dispatcher) wake(ctx context.Context, nodes ...string) {
	for _, n := range nodes {
		d.hub.Wake(n)
	}
	if d.cfg.NoReplicaWakeups {
		return
	}
	if err := d.st.Notify(ctx, NotifyChannel, strings.Join(nodes, ",")); err != nil {
		d.log.Warn("notify", "nodes", nodes, "err", err)
	}
}

// wakeFromNotify wakes the polls of every node named in a notification's payload.
func (d *Dispatcher) wakeFromNotify(payload string) {
	for _, n := range strings.Split(payload, ",") {
		d.hub.Wake(n)
	}
}

// taskFor maps an outbox event to the task it needs, or nil for informational events.
// needsTask reports whether an outbox event becomes a host task (given its allocation is a
// slice): provisioning, release, and cleanup of a failed allocation that reached its host.
func needsTask(ev store.OutboxEvent) bool {
	switch ev.Topic {
	case "allocation.requested", "allocation.release_requested":
		return true
	case "allocation.failed":
		var p struct {
			Touched bool `json:"touched"`
		}
		return json.Unmarshal(ev.Payload, &p) == nil && p.Touched // untouched: nothing to clean
	}
	return false
}

// taskFor builds the host task of an event that needsTask, from its allocation's plan.
func (d *Dispatcher) taskFor(ev store.OutboxEvent, rec store.DispatchInfo) (*store.NewTask, error) {
	if ev.Topic == "allocation.requested" && rec.Status != "requested" {
		return nil, nil // released (or re-placed) before it was dispatched: nothing to provision
	}
	if rec.CapacityShape != "gpu_slice" {
		// Baremetal deploys go through MAAS, a boundary this build does not drive.
		d.log.Info("baremetal allocation event not dispatched to a host agent (MAAS deploy)", "allocation", rec.ID, "topic", ev.Topic)
		return nil, nil
	}
	bundles, housekeeping, err := planFromSnapshots(rec.Snapshots)
	if err != nil {
		return nil, err
	}
	if ev.Topic == "allocation.release_requested" || ev.Topic == "allocation.failed" {
		return &store.NewTask{NodeID: rec.NodeID, AllocationID: rec.ID, Type: string(task.TypeVMRelease), OutboxID: ev.ID, TTL: d.cfg.ReleaseTTL,
			Payload: task.VMRelease{AllocationID: rec.ID, Bundles: bundles, Wipe: true, GracefulTimeoutS: 120}}, nil
	}
	var prof task.Profile
	if err := json.Unmarshal(rec.ResolvedProfile, &prof); err != nil {
		return nil, fmt.Errorf("profile snapshot: %w", err)
	}
	var img task.Image
	if err := json.Unmarshal(rec.ImageSnapshot, &img); err != nil {
		return nil, fmt.Errorf("image snapshot: %w", err)
	}
	var keys []imagesig.Key
	if img.SignatureRequired {
		keys = d.cfg.ImageKeys
	}
	return &store.NewTask{NodeID: rec.NodeID, AllocationID: rec.ID, Type: string(task.TypeVMProvision), OutboxID: ev.ID, TTL: d.cfg.ProvisionTTL,
		Payload: task.VMProvision{AllocationID: rec.ID, Bundles: bundles, Profile: prof, Image: img, SSHPublicKeys: rec.SSHPublicKeys,
			HousekeepingCPUs: housekeeping, ImageKeys: keys}}, nil
}

// bundlesFromSnapshots turns claim snapshots (the slot as it was reserved) into task bundles.
func bundlesFromSnapshots(snaps []json.RawMessage) ([]task.Bundle, error) {
	b, _, err := planFromSnapshots(snaps)
	return b, err
}

// planFromSnapshots turns claim snapshots (the slot as it was reserved, with its node's
// housekeeping set then) into task bundles and the housekeeping set (cpulist).
func planFromSnapshots(snaps []json.RawMessage) ([]task.Bundle, string, error) {
	var housekeeping []int
	bundles := make([]task.Bundle, 0, len(snaps))
	for _, s := range snaps {
		var b task.Bundle
		var raw struct {
			SlotID    string `json:"slot_id"`
			SlotIndex int    `json:"slot_index"`
			NUMANode  *int   `json:"numa_node"`
			PCI       string `json:"pci_address"`
			FabricPCI string `json:"fabric_pci_address"`
			FabricVF  string `json:"fabric_vf_pci_address"`
			NVMe      string `json:"nvme_device"`
			MAC       string `json:"mac_address"`
			IP        string `json:"private_ip"`
			Wipe      string `json:"destructive_wipe_policy"`
			DiskID    string `json:"disk_identity"`
			VCPU      *int   `json:"vcpu_count"`
			MemoryMiB *int   `json:"memory_mib"`
			HostCPUs  []int  `json:"host_cpus"`
			Housekeep []int  `json:"housekeeping_cpus"`
		}
		if err := json.Unmarshal(s, &raw); err != nil {
			return nil, "", err
		}
		housekeeping = cpuset.Union(housekeeping, raw.Housekeep)
		b = task.Bundle{SlotID: raw.SlotID, SlotIndex: raw.SlotIndex, GPUPCI: raw.PCI, FabricParentPCI: raw.FabricPCI,
			FabricVFPCI: raw.FabricVF, NVMeDevice: raw.NVMe, NUMANode: raw.NUMANode, MACAddress: raw.MAC, PrivateIP: raw.IP, WipePolicy: raw.Wipe,
			DiskIdentity: raw.DiskID, HostCPUs: cpuset.Format(raw.HostCPUs)}
		if raw.VCPU != nil {
			b.VCPUCount = *raw.VCPU
		}
		if raw.MemoryMiB != nil {
			b.MemoryMiB = *raw.MemoryMiB
		}
		bundles = append(bundles, b)
	}
	return bundles, cpuset.Format(housekeeping), nil
}

// Poll waits up to wait for a task for node, leases it and returns it signed; nil when the
// wait ends with nothing to do.
func (d *Dispatcher) Poll(ctx context.Context, nodeID string, wait time.Duration) (*task.Envelope, error) {
	envs, err := d.PollMany(ctx, nodeID, wait, 1)
	if err != nil || len(envs) == 0 {
		return nil, err
	}
	return envs[0], nil
}

// PollMany waits up to wait for tasks for node and leases up to max of them (at least one
// unless the wait ends first), returned signed, oldest first. A host with free task slots
// takes a burst of tasks in one request instead of one poll each.
func (d *Dispatcher) PollMany(ctx context.Context, nodeID string, wait time.Duration, max int) ([]*task.Envelope, error) {
	ch, cancel := d.hub.Subscribe(nodeID) // subscribe first: a wake between lease and wait is not lost
	defer cancel()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	// A renewed poll of an idle host costs no query when nothing woke the node since the last
	// lease query came back empty (checked again at least every emptyRecheck or lease).
	skip := d.hub.NothingNew(nodeID, d.now(), min(emptyRecheck, d.cfg.Lease))
	for {
		var out []*task.Envelope
		gen := d.hub.Gen(nodeID)
		if !skip {
			trs, err := d.st.LeaseTasks(ctx, nodeID, d.cfg.Lease, max)
			if err != nil {
				return nil, err
			}
			if len(trs) == 0 {
				d.hub.Empty(nodeID, gen, d.now())
			}
			// Every provisioning allocation of the batch is marked in one transaction.
			marks, markErr := d.markProvisioning(ctx, trs)
			for _, tr := range trs {
				env, err := d.sign(ctx, tr, marks, markErr)
				switch {
				case err == nil:
					out = append(out, env)
				case errors.Is(err, errTaskCancelled):
				case len(out) > 0:
					// Signed ones go out; this one is redelivered when its lease ends.
					d.log.Warn("lease in a batch failed", "node", nodeID, "task", tr.ID, "err", err)
				default:
					return nil, err
				}
			}
			if len(out) == 0 && len(trs) > 0 {
				continue // every leased task was cancelled: look again at once
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		skip = false
		select {
		case <-ctx.Done():
			return nil, nil
		case <-timer.C:
			return nil, nil
		case <-ch:
		}
	}
}

// emptyRecheck (or the lease, if shorter) bounds how long renewed polls skip the lease
// query: a task whose lease expired (its host died mid-task) becomes runnable without a wake.
const emptyRecheck = time.Minute

// markProvisioning marks the allocations of a batch's provisioning tasks provisioning (the
// host has the plan; idempotent on redelivery) in one transaction, and returns each
// allocation's status afterwards.
func (d *Dispatcher) markProvisioning(ctx context.Context, trs []store.TaskRecord) (map[string]string, error) {
	var ids []string
	for _, tr := range trs {
		if provisions(tr) {
			ids = append(ids, tr.AllocationID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	return d.alloc.MarkProvisioningMany(ctx, ids)
}

// provisions reports whether a task provisions an allocation (its delivery marks the
// allocation provisioning).
func provisions(tr store.TaskRecord) bool {
	return tr.Type == string(task.TypeVMProvision) && tr.AllocationID != ""
}

// sign signs a leased task for its host; a provisioning task only once its allocation is
// provisioning or active (marks, markErr: markProvisioning's answer for the batch). One whose
// allocation was released or failed before its host took it is cancelled, not delivered.
func (d *Dispatcher) sign(ctx context.Context, tr store.TaskRecord, marks map[string]string, markErr error) (*task.Envelope, error) {
	if provisions(tr) {
		if markErr != nil {
			return nil, markErr
		}
		if st := marks[tr.AllocationID]; st != "provisioning" && st != "active" {
			if err := d.st.CancelTask(ctx, tr.ID, "allocation is "+st+"; not delivered"); err != nil {
				return nil, err
			}
			return nil, errTaskCancelled
		}
	}
	e := &task.Envelope{TaskID: tr.ID, NodeID: tr.NodeID, Type: task.Type(tr.Type), Payload: tr.Payload,
		IssuedAt: d.now().UTC(), NotAfter: tr.NotAfter.UTC(), Attempt: tr.Attempt}
	if tr.SchemaVersion > 1 { // version 1 stays off the wire, as hosts that predate versioning expect
		e.SchemaVersion = tr.SchemaVersion
	}
	if err := e.Sign(d.key); err != nil {
		return nil, err
	}
	return e, nil
}

// errTaskCancelled: a leased task turned out not to be deliverable and was cancelled.
var errTaskCancelled = errors.New("task cancelled")

func isConflict(err error) bool {
	var ae *apiv1.Error
	return errors.As(err, &ae) && ae.Code == apiv1.CodeConflict
}

// Progress records live phases and extends the lease of a running task.
func (d *Dispatcher) Progress(ctx context.Context, nodeID, taskID string, p task.Progress) error {
	b, err := json.Marshal(p.Phases)
	if err != nil {
		return err
	}
	return d.st.ExtendLease(ctx, taskID, nodeID, d.cfg.Lease, b)
}

// Result records a task's result (a duplicate is accepted and changes nothing) and drives
// the allocation: provision success -> active; failure/refusal -> failed with the reason;
// release -> released, each slot available only with its wipe proof.
func (d *Dispatcher) Result(ctx context.Context, nodeID, taskID string, r task.Result) (store.TaskRecord, error) {
	switch r.Status {
	case "succeeded", "failed", "refused":
	default:
		return store.TaskRecord{}, &apiv1.Error{Code: apiv1.CodeInvalidRequest, Message: "status must be succeeded, failed or refused"}
	}
	phases, err := json.Marshal(r.Phases)
	if err != nil {
		return store.TaskRecord{}, err
	}
	var tr store.TaskRecord
	err = d.st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		tr, _, err = tx.CompleteTask(ctx, taskID, nodeID, r.Status, r.Output, phases, r.Error)
		if err != nil {
			return err
		}
		// A success whose report cannot be read is refused, not recorded: recorded, it could
		// never be applied and the host's retries would fail forever.
		return checkOutput(tr)
	})
	if err != nil {
		return tr, err
	}
	// Drive the allocation from the recorded (first) result, also on duplicates, so a
	// controller crash between the two steps is repaired by the host's retry.
	if err := d.apply(ctx, tr); err != nil {
		return tr, err
	}
	d.stageAfter(ctx, tr) // warm slots (staging.go)
	return tr, nil
}

// checkOutput refuses a succeeded discovery or reconcile result whose report is not a JSON
// object of the expected shape.
func checkOutput(tr store.TaskRecord) error {
	if tr.Status != "succeeded" {
		return nil
	}
	var into any
	switch tr.Type {
	case string(task.TypeTopologyDiscover):
		into = &topology.Report{}
	case string(task.TypeReconcile):
		into = &task.ReconcileReport{}
	default:
		return nil
	}
	if len(tr.Output) == 0 || tr.Output[0] != '{' {
		return &apiv1.Error{Code: apiv1.CodeInvalidRequest, Message: tr.Type + " succeeded without its report (output must be a JSON object)"}
	}
	if err := json.Unmarshal(tr.Output, into); err != nil {
		return &apiv1.Error{Code: apiv1.CodeInvalidRequest, Message: tr.Type + " report: " + err.Error()}
	}
	return nil
}

func (d *Dispatcher) apply(ctx context.Context, tr store.TaskRecord) error {
	if tr.Type == string(task.TypeImageStage) {
		return d.applyStaging(ctx, tr)
	}
	if tr.Type == string(task.TypeTopologyDiscover) && tr.Status == "succeeded" {
		return d.applyDrift(ctx, tr)
	}
	if tr.Type == string(task.TypeWipeVerify) {
		return d.applyRepair(ctx, tr)
	}
	if tr.Type == string(task.TypeSlotValidate) {
		return d.applyValidation(ctx, tr)
	}
	if tr.Type == string(task.TypeReconcile) && tr.Status == "succeeded" {
		return d.applyReconcile(ctx, tr)
	}
	if tr.AllocationID == "" {
		return nil
	}
	var err error
	switch {
	case tr.Type == string(task.TypeVMProvision) && tr.Status == "succeeded" && !d.cfg.AllowSimulated && simulatedOutput(tr.Output):
		err = d.alloc.MarkFailed(ctx, tr.AllocationID, refusedSimulatedProvision)
	case tr.Type == string(task.TypeVMProvision) && tr.Status == "succeeded":
		err = d.alloc.MarkActive(ctx, tr.AllocationID)
	case tr.Type == string(task.TypeVMProvision):
		reason := tr.Error
		if reason == "" {
			reason = "provisioning " + tr.Status
		}
		if strings.Contains(reason, "plan_invalid: ") {
			err = d.replace(ctx, tr, reason)
		} else {
			err = d.alloc.MarkFailed(ctx, tr.AllocationID, reason)
		}
	case tr.Type == string(task.TypeVMRelease):
		var out task.ReleaseOutput
		_ = json.Unmarshal(tr.Output, &out) // a failed release may carry partial or no proofs
		proofs := map[string]alloc.WipeProof{}
		for slot, p := range out.Wiped {
			proofs[slot] = d.checkSimulated(d.checkProof(ctx, tr, slot, p), out.Simulated)
		}
		if tr.Status != "succeeded" {
			// A slot the failed release left without proof is blocked with the host's error
			// (e.g. host_state_unwritable), not a bare "wipe not verified".
			var p task.VMRelease
			if json.Unmarshal(tr.Payload, &p) == nil {
				for _, b := range p.Bundles {
					if _, ok := proofs[b.SlotID]; !ok {
						proofs[b.SlotID] = alloc.WipeProof{Error: "release " + tr.Status + ": " + tr.Error}
					}
				}
			}
		}
		err = d.alloc.CompleteRelease(ctx, tr.AllocationID, proofs)
		if isConflict(err) {
			// A cleanup after a failed provision: the allocation stays failed, its slots
			// return only with proof.
			err = d.alloc.CleanupFailed(ctx, tr.AllocationID, proofs)
		}
		if err == nil {
			err = d.queueValidations(ctx, tr.NodeID)
		}
		if err == nil && len(out.Wiped) > 0 {
			err = d.st.InTx(ctx, func(tx *store.Tx) error {
				return tx.Audit(ctx, store.AuditRecord{Actor: "node:" + tr.NodeID, ActorRole: "node", Action: "slot.wipe",
					TargetKind: "allocation", TargetID: tr.AllocationID, Details: map[string]any{"task_id": tr.ID, "wiped": out.Wiped, "simulated": out.Simulated}})
			})
		}
	}
	if isConflict(err) {
		d.log.Warn("task result does not match allocation state", "task", tr.ID, "allocation", tr.AllocationID, "err", err)
		return nil
	}
	return err
}

// refusedSimulatedProvision is the failure reason of an allocation a simulated host
// "provisioned" on a controller that does not sell simulated hosts.
const refusedSimulatedProvision = "simulated provisioning refused: the host runs the sim runtime and no VM exists (the controller does not allow simulated hosts)"

// simulatedOutput reports a task output that says it was simulated (the sim runtime's
// "simulated": true).
func simulatedOutput(out json.RawMessage) bool {
	var o struct {
		Simulated bool   `json:"simulated"`
		Runtime   string `json:"runtime"`
	}
	return json.Unmarshal(out, &o) == nil && (o.Simulated || o.Runtime == "sim")
}

// checkSimulated refuses a simulated wipe proof (method simulated, or the release said it was
// simulated) unless simulated hosts are allowed: nothing was written, so the slot must not go
// back on sale. The refusal keeps the method so the record says what the host claimed.
func (d *Dispatcher) checkSimulated(p alloc.WipeProof, simulated bool) alloc.WipeProof {
	if d.cfg.AllowSimulated || (!simulated && p.Method != "simulated") {
		return p
	}
	p.Verified = false
	p.Error = "simulated wipe refused: no disk was written (the controller does not allow simulated hosts)"
	return p
}

// replace answers a host's plan_invalid: place the allocation on another node, or fail it
// with the host's reason and why nothing else fits (sku_unavailable).
func (d *Dispatcher) replace(ctx context.Context, tr store.TaskRecord, reason string) error {
	node, err := d.alloc.Replace(ctx, tr.AllocationID, tr.NodeID, reason)
	var nr *alloc.ErrNoReplacement
	switch {
	case err == nil:
		d.log.Warn("host refused the plan; allocation placed on another node", "allocation", tr.AllocationID, "from_node", tr.NodeID, "to_node", node, "reason", reason)
		d.Kick()
		return nil
	case errors.As(err, &nr) && nr.Stale:
		d.log.Info("stale plan_invalid result ignored", "allocation", tr.AllocationID, "task", tr.ID, "why", nr.Reason)
		return nil
	case errors.As(err, &nr):
		return d.alloc.MarkPlanInvalid(ctx, tr.AllocationID, reason+"; "+nr.Reason)
	default:
		return err
	}
}

// Reap expires tasks past their deadline (or out of attempts) and fails their allocations.
func (d *Dispatcher) Reap(ctx context.Context) error {
	var expired []store.TaskRecord
	err := d.st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		expired, err = tx.ExpireTasks(ctx)
		return err
	})
	if err != nil {
		return err
	}
	for _, tr := range expired {
		d.log.Warn("task expired", "task", tr.ID, "type", tr.Type, "node", tr.NodeID, "reason", tr.Error)
		if err := d.apply(ctx, tr); err != nil {
			return err
		}
	}
	return d.reapplyStranded(ctx)
}

// reapplyStranded drives allocations from results that were recorded but whose effect was
// lost (store.StrandedResults: the database lost the second of the two transactions, after
// an asynchronous failover). apply is what the result's own request ran; it is idempotent.
func (d *Dispatcher) reapplyStranded(ctx context.Context) error {
	stranded, err := d.st.StrandedResults(ctx, d.cfg.ReapplyAfter)
	if err != nil {
		return err
	}
	for _, tr := range stranded {
		d.log.Warn("applying a recorded task result that never moved its allocation", "task", tr.ID, "type", tr.Type,
			"allocation", tr.AllocationID, "status", tr.Status)
		if err := d.apply(ctx, tr); err != nil && ctx.Err() == nil {
			// One that cannot be applied must not hold up the others; it is tried again
			// on the next rounds until it leaves the window (store.StrandedResults).
			d.log.Error("applying a recorded task result", "task", tr.ID, "allocation", tr.AllocationID, "err", err)
		}
	}
	return ctx.Err()
}

// QueueTask queues a task that belongs to no allocation (e.g. topology discovery) and wakes
// the node's polls here and on other replicas.
func (d *Dispatcher) QueueTask(ctx context.Context, nodeID string, t task.Type, payload any, ttl time.Duration, audit ...store.AuditRecord) (string, error) {
	var id string
	err := d.st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		if id, err = tx.InsertTask(ctx, store.NewTask{NodeID: nodeID, Type: string(t), Payload: payload, TTL: ttl}); err != nil {
			return err
		}
		for _, a := range audit { // in the same transaction: no task without its audit record
			if details, ok := a.Details.(map[string]any); ok {
				details["task_id"] = id
			}
			if err := tx.Audit(ctx, a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	d.wake(ctx, nodeID)
	return id, nil
}

// applyDrift disables available slots whose devices no longer match the host (rediscovery),
// blocking only those slots. Slots in use are left to the release path's wipe proof.
func (d *Dispatcher) applyDrift(ctx context.Context, tr store.TaskRecord) error {
	var rep topology.Report
	if err := json.Unmarshal(tr.Output, &rep); err != nil {
		return fmt.Errorf("discovery output: %w", err)
	}
	slots, err := d.st.ListSlots(ctx, tr.NodeID)
	if err != nil {
		return err
	}
	var approved []topology.Approved
	for _, s := range slots {
		if s.Status != "available" {
			continue
		}
		var md struct {
			VF string `json:"fabric_vf_pci_address"`
		}
		_ = json.Unmarshal(s.CapacityMetadata, &md)
		approved = append(approved, topology.Approved{SlotIndex: s.SlotIndex, GPUPCI: s.PCIAddress, NVMeDevice: s.NVMeDevice, FabricVFPCI: md.VF})
	}
	drift := topology.Drift(&rep, approved)
	if len(drift) == 0 {
		return nil
	}
	return d.st.InTx(ctx, func(tx *store.Tx) error {
		for idx, reasons := range drift {
			reason := "drift: " + strings.Join(reasons, "; ")
			sl, err := tx.SetSlotEnabled(ctx, tr.NodeID, idx, false, reason)
			if err != nil {
				return err
			}
			d.log.Warn("slot disabled by discovery drift", "node", tr.NodeID, "slot", idx, "reason", reason)
			if err := tx.Audit(ctx, store.AuditRecord{Actor: "gpuaas-controller", ActorRole: "system", Action: "slot.drift",
				TargetKind: "slot", TargetID: sl.ID, Details: map[string]any{"node_id": tr.NodeID, "slot_index": idx, "drift": reasons, "task_id": tr.ID}}); err != nil {
				return err
			}
		}
		return nil
	})
}

// applyRepair records a slot.wipe_verify result: verified proof returns the slot to service.
func (d *Dispatcher) applyRepair(ctx context.Context, tr store.TaskRecord) error {
	var p task.WipeVerify
	if err := json.Unmarshal(tr.Payload, &p); err != nil || !p.Apply {
		return err // a dry run changes nothing
	}
	var ev struct {
		Verified bool            `json:"verified"`
		Method   string          `json:"method"`
		Error    string          `json:"error"`
		Bytes    int64           `json:"bytes"`
		Proof    *task.WipeProof `json:"proof"`
	}
	_ = json.Unmarshal(tr.Output, &ev)
	hp := task.WipeProof{Method: ev.Method, Error: ev.Error} // no signed proof: never verified
	if ev.Proof != nil {
		hp = *ev.Proof
	}
	hp.Evidence = fmt.Sprintf("slot.wipe_verify task %s: %d bytes", tr.ID, ev.Bytes)
	proof := d.checkSimulated(d.checkProof(ctx, tr, p.SlotID, hp), false)
	if proof.Error == "" && tr.Status != "succeeded" {
		proof.Error = tr.Error
	}
	err := d.alloc.RepairSlot(ctx, p.SlotID, proof)
	if err == nil {
		err = d.queueValidations(ctx, tr.NodeID)
	}
	if isConflict(err) {
		d.log.Warn("wipe result for a slot not awaiting repair", "slot", p.SlotID, "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	return d.st.InTx(ctx, func(tx *store.Tx) error {
		return tx.Audit(ctx, store.AuditRecord{Actor: "node:" + tr.NodeID, ActorRole: "node", Action: "slot.wipe",
			TargetKind: "slot", TargetID: p.SlotID, Details: map[string]any{"task_id": tr.ID, "evidence": json.RawMessage(tr.Output), "verified": proof.Verified}})
	})
}
