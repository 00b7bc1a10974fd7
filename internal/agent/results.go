package agent

import (
	"context"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
)

func (a *Agent) kickSender() {
	select {
	case a.sendNow <- struct{}{}:
	default:
	}
}

func (a *Agent) sendLoop(ctx context.Context) {
	retry := time.NewTicker(5 * time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.sendNow:
		case <-retry.C:
		}
		a.sendPending(ctx)
	}
}

// resultTimeout bounds one result delivery.
const resultTimeout = 30 * time.Second

// writableFor checks the state dir can take the result of a task of type t, when t is one
// that changes the host.
func (a *Agent) writableFor(t task.Type) error {
	if !changesHost(t) {
		return nil
	}
	return a.spool.Writable()
}

// changesHost reports whether a task type writes to the host (VMs, disks): those are not
// started while the state dir cannot record their outcome.
func changesHost(t task.Type) bool {
	switch t {
	case task.TypeVMProvision, task.TypeVMRelease, task.TypeStorageTransit, task.TypeWipeVerify, task.TypeSlotValidate, task.TypeImageStage:
		return true
	}
	return false
}

// ReasonStateUnwritable is a task result's reason when hostd's state dir cannot be written
// (full or read-only): the task was not started.
const ReasonStateUnwritable = "host_state_unwritable"

// deliver sends one result that is not in the spool (best effort: an unacknowledged task is
// redelivered when its lease ends).
func (a *Agent) deliver(ctx context.Context, r task.Result) {
	dctx, cancel := context.WithTimeout(ctx, resultTimeout)
	defer cancel()
	resp, data, err := a.do(dctx, "POST", "/api/v1/agent/tasks/"+r.TaskID+"/result", r)
	switch {
	case err != nil:
		a.log.Warn("unspooled result not delivered; the task will be redelivered", "task", r.TaskID, "err", err)
	case resp.StatusCode >= 300:
		a.log.Warn("unspooled result refused", "task", r.TaskID, "err", apiError(resp, data))
	}
}

// sendPending delivers spooled results; each is removed only once acknowledged.
func (a *Agent) sendPending(ctx context.Context) {
	pending, err := a.spool.Pending()
	if err != nil {
		a.log.Error("spool", "err", err)
		return
	}
	for _, r := range pending {
		// Bounded: a connection blackholed by a partition must not hold the sender forever
		// (the transport has no timeout of its own: long polls share it).
		rctx, cancel := context.WithTimeout(ctx, resultTimeout)
		resp, data, err := a.do(rctx, "POST", "/api/v1/agent/tasks/"+r.TaskID+"/result", r)
		cancel()
		if err != nil {
			a.log.Debug("result not delivered yet", "task", r.TaskID, "err", err)
			return // controller unreachable: keep everything, retry later
		}
		switch {
		case resp.StatusCode < 300:
			_ = a.spool.Acknowledged(r.TaskID)
		case resp.StatusCode >= 500:
			return
		default:
			// The controller will never accept it (unknown task, bad body): keep a log, drop it.
			a.log.Error("result rejected; dropping", "task", r.TaskID, "err", apiError(resp, data))
			_ = a.spool.Remove(r.TaskID)
		}
	}
}
