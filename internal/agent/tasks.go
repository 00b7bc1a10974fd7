package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/prereq"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/topology"
)

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
			// Already completed here and its result delivered: a controller asking again lost
			// that result (restored from an earlier backup), so it is reported again.
			if a.spool.Requeue(env.TaskID) {
				log.Info("task already completed here; its result is reported again")
				a.kickSender()
			}
			return
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

func taskIDSafe(id string) bool {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\\") || strings.HasPrefix(id, ".") {
		return false
	}
	return true
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
	case *task.ImageStage:
		st, ok := a.runtime.(slicevm.Stager)
		if !ok {
			err = fmt.Errorf("runtime %s cannot stage images", a.runtime.Name())
			break
		}
		out, err = st.Stage(ctx, p, rec)
	case *task.WipeVerify:
		if st, ok := a.runtime.(slicevm.Stager); ok {
			st.DropStaged(p.SlotID) // whatever was staged on the disk is about to be erased
		}
		err = rec.Run("wipe_verify", func() error {
			ev, werr := a.wiper().WipeWith(ctx, disk.WipeOptions{Device: p.Device, Apply: p.Apply, Policy: p.Policy, Identity: p.DiskIdentity})
			out = a.signedWipe(env, p, ev, werr)
			if werr == nil && p.Apply && !ev.Verified {
				werr = fmt.Errorf("wipe not verified: %s", ev.Error)
			}
			return werr
		})
	case *task.SlotValidate:
		err = rec.Run("validate", func() error {
			r, verr := a.validateSlot(ctx, p, a.slotLeases(), rec)
			if verr == nil {
				out = r
			}
			return verr
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
			out = prereq.Run(a.host, prereq.Options{HugepagesGiB: p.HugepagesGiB, Bridge: p.Bridge, LabHost: a.cfg.LabHost})
			return nil
		})
	case *task.TopologyDiscover:
		err = rec.Run("topology_discover", func() error {
			r, derr := topology.DiscoverWith(a.host, a.cfg.DiscoverOptions())
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

func (a *Agent) wiper() disk.Wiper { return disk.Wiper{FS: a.host, Run: hostfs.Exec{}} }

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
