// Package slicevm runs the slice VM lifecycle on a host: provision in the 17 timed phases of
// seed 000, release with wipe, and drift reconciliation. Runtimes: Host (libvirt, the
// production path, and lab: the same code under software emulation with loop devices and no
// passthrough) and Sim (no VM; every output says simulated, for load tests).
package slicevm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
)

// ProvisionPhases are the 17 phases of slice.vm_provision, in order (seed 000).
var ProvisionPhases = task.ProvisionPhases

// ReleasePhases are the phases of slice.vm_release (seed 000 "Release").
var ReleasePhases = task.ReleasePhases

// Recorder times phases and reports them as they finish.
type Recorder struct {
	TaskID   string // the task being run (leases record it)
	Now      func() time.Time
	OnUpdate func([]task.Phase) // called after each phase (live progress)
	// AfterWork, when set, is called inside each phase after its work and before the phase
	// is recorded as finished: the crash point "side effect done, nobody told yet". Only
	// tests set it (agent.Knobs), to park a daemon there and kill it.
	AfterWork func(phase string)
	// Simulated records a phase that did its (simulated) work as "simulated", never "ok":
	// the sim runtime sets it, so no report of a VM that does not exist says ok.
	Simulated bool
	mu        sync.Mutex
	phases    []task.Phase
}

// Run times fn as phase name; an error marks the phase failed and is returned, a Skip marks it
// skipped with its reason.
func (r *Recorder) Run(name string, fn func() error) error {
	return r.RunDetail(name, func() (string, error) { return "", fn() })
}

// RunDetail is Run for a phase that reports what it did (shown beside its status).
func (r *Recorder) RunDetail(name string, fn func() (string, error)) error {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	start := now()
	detail, err := fn()
	if r.AfterWork != nil {
		r.AfterWork(name)
	}
	p := task.Phase{Name: name, StartedAt: start.UTC(), DurationMS: now().Sub(start).Milliseconds(), Status: "ok", Detail: detail}
	if r.Simulated {
		p.Status = PhaseSimulated
	}
	var skip skipped
	switch {
	case errors.As(err, &skip):
		p.Status, p.Detail, err = "skipped", skip.reason, nil
	case err != nil:
		p.Status, p.Error = "failed", err.Error()
	}
	r.mu.Lock()
	r.phases = append(r.phases, p)
	r.mu.Unlock()
	if r.OnUpdate != nil {
		r.OnUpdate(r.Phases())
	}
	return err
}

// Progress reports a phase still running (e.g. bytes downloaded) to OnUpdate as a last entry
// with status "running"; it is not kept among the finished phases.
func (r *Recorder) Progress(name, detail string) {
	if r.OnUpdate == nil {
		return
	}
	now := r.Now
	if now == nil {
		now = time.Now
	}
	r.OnUpdate(append(r.Phases(), task.Phase{Name: name, StartedAt: now().UTC(), Status: "running", Detail: detail}))
}

// PhaseSimulated is the status of a phase the sim runtime walked: nothing was done on a host.
const PhaseSimulated = "simulated"

type skipped struct{ reason string }

func (s skipped) Error() string { return "skipped: " + s.reason }

// Skip ends a phase as skipped (never "ok") with the reason, e.g. Skip("lab host").
func Skip(reason string) error { return skipped{reason} }

// Phases returns a copy of the phases so far.
func (r *Recorder) Phases() []task.Phase {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]task.Phase(nil), r.phases...)
}

// Runtime provisions and releases slice VMs.
type Runtime interface {
	Name() string
	Provision(ctx context.Context, p *task.VMProvision, rec *Recorder) (task.ProvisionOutput, error)
	Release(ctx context.Context, p *task.VMRelease, rec *Recorder) (task.ReleaseOutput, error)
}

// VMName is the libvirt domain name of an allocation.
func VMName(allocationID string) string { return "gpuaas-" + allocationID }

// Sim is the simulated runtime: it validates the plan and walks every phase without touching
// the host. Its outputs are labelled simulated; its wipe proofs say no disk was written.
type Sim struct {
	// PhaseDelay is how long each simulated phase takes (0 = instant).
	PhaseDelay time.Duration
	// Hold names a phase that, once started, never finishes on its own: the task stays in
	// it until cancelled or the daemon dies. Crash tests use it to kill a host in a chosen
	// phase without racing the clock; "" holds none.
	Hold string
}

func (s Sim) pause(ctx context.Context, rec *Recorder, phase string) error {
	if s.PhaseDelay > 0 {
		t := time.NewTimer(s.PhaseDelay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	if phase != "" && phase == s.Hold {
		rec.Progress(phase, "held (--sim-hold-phase)")
		<-ctx.Done()
		return fmt.Errorf("held in phase %s (--sim-hold-phase): %w", phase, ctx.Err())
	}
	return ctx.Err()
}

// Name is "sim".
func (Sim) Name() string { return "sim" }

func validatePlan(bundles []task.Bundle) error {
	if len(bundles) == 0 {
		return fmt.Errorf("plan has no bundles")
	}
	seen := map[string]bool{}
	for _, b := range bundles {
		for _, id := range []string{b.GPUPCI, b.FabricVFPCI, b.NVMeDevice} {
			if id == "" {
				return fmt.Errorf("slot %d: incomplete bundle", b.SlotIndex)
			}
			if seen[id] {
				return fmt.Errorf("slot %d: device %s appears twice in the plan", b.SlotIndex, id)
			}
			seen[id] = true
		}
	}
	return nil
}

// Provision walks the 17 phases.
func (s Sim) Provision(ctx context.Context, p *task.VMProvision, rec *Recorder) (task.ProvisionOutput, error) {
	rec.Simulated = true
	out := task.ProvisionOutput{Runtime: "sim", Simulated: true, VMName: VMName(p.AllocationID)}
	if len(p.Bundles) > 0 {
		out.PrivateIP = p.Bundles[0].PrivateIP
	}
	for _, ph := range ProvisionPhases {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		err := rec.Run(ph, func() error {
			if err := s.pause(ctx, rec, ph); err != nil {
				return err
			}
			if ph == "lease_acquire" {
				return validatePlan(p.Bundles)
			}
			if ph == "image_stat_download" {
				_, err := verifyImageSignature(p) // the same check a VM host makes
				return err
			}
			if ph == "image_digest_verify" && len(p.Image.DigestSHA256) != 64 {
				return fmt.Errorf("image %s has no sha256 digest", p.Image.Slug)
			}
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("%s: %w", ph, err)
		}
	}
	return out, nil
}

// Release walks the release phases (each PhaseDelay long, so a crash test can land in any
// of them); wipe proofs are simulated (nothing was written).
func (s Sim) Release(ctx context.Context, p *task.VMRelease, rec *Recorder) (task.ReleaseOutput, error) {
	rec.Simulated = true
	out := task.ReleaseOutput{Runtime: "sim", Simulated: true, VMName: VMName(p.AllocationID), Wiped: map[string]task.WipeProof{}, SlotCount: len(p.Bundles)}
	for _, ph := range ReleasePhases {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if err := rec.Run(ph, func() error { return s.pause(ctx, rec, ph) }); err != nil {
			return out, err
		}
	}
	for _, b := range p.Bundles {
		if p.Wipe {
			out.Wiped[b.SlotID] = task.WipeProof{Verified: true, Method: "simulated",
				Evidence: "sim runtime: no VM ran and no disk was written on " + b.NVMeDevice}
		}
	}
	out.Released, out.LeasesReleased = true, len(p.Bundles)
	return out, nil
}
