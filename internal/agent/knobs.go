package agent

import (
	"context"

	"github.com/gpuaas/gpuaas/internal/task"
)

// Knobs are testing hooks for a test binary that runs hostd in-process (internal/e2e): the
// gpuaas-hostd binary never sets them, and no flag, config key or environment variable
// reaches them, so production has no test endpoint (the cockroachdb TestingKnobs habit).
type Knobs struct {
	// PhaseDone is called inside every phase of a slice VM task, after the phase's work and
	// before the phase is recorded as finished. The lab fault test parks hostd there (it
	// blocks until ctx ends) and kills it with SIGKILL: the crash lands inside the named
	// phase, its side effects done and not yet known to anyone.
	PhaseDone func(ctx context.Context, p PhasePoint)
	// LoopStep is called by the poll loop at each turn, before it polls: the watchdog test
	// blocks it to make a stuck loop.
	LoopStep func(ctx context.Context)
}

func (k Knobs) loopStep(ctx context.Context) {
	if k.LoopStep != nil {
		k.LoopStep(ctx)
	}
}

// PhasePoint names where a slice VM task is.
type PhasePoint struct {
	TaskID, Type, AllocationID string
	Attempt                    int
	Phase                      string
}

// phaseHook is the Recorder.AfterWork of one task, or nil without a PhaseDone knob.
func (k Knobs) phaseHook(ctx context.Context, env *task.Envelope, payload any) func(string) {
	if k.PhaseDone == nil {
		return nil
	}
	alloc := ""
	switch p := payload.(type) {
	case *task.VMProvision:
		alloc = p.AllocationID
	case *task.VMRelease:
		alloc = p.AllocationID
	default:
		return nil
	}
	return func(phase string) {
		k.PhaseDone(ctx, PhasePoint{TaskID: env.TaskID, Type: string(env.Type), AllocationID: alloc, Attempt: env.Attempt, Phase: phase})
	}
}
