package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
)

// defaultBurnInTimeout bounds the wait for a validation VM's report when the task sets none.
const defaultBurnInTimeout = 10 * time.Minute

// burnIn is the burn-in part of a slot.validate (docs/health.md): it boots the slot's
// validation VM from the task's plan through the same provisioning path a slice takes (the
// slot's GPU and VF as hostdevs, its disk as the boot disk), waits for the guest's validation
// report on the guest telemetry channel, then releases the VM and wipes and verifies the
// slot's disk again (the VM wrote its image there). The sim runtime boots nothing and says so.
// Every step is a check of the result; a failed step fails the validation.
func (a *Agent) burnIn(ctx context.Context, p *task.SlotValidate, rec *slicevm.Recorder) []apiv1.ValidationCheck {
	fail := func(name, detail string) []apiv1.ValidationCheck {
		return []apiv1.ValidationCheck{{Name: name, Passed: false, Detail: detail}}
	}
	plan := p.BurnIn
	switch {
	case plan == nil:
		return fail("burn-in plan", "the task carries no validation VM plan")
	case !plan.Validation || len(plan.Bundles) != 1 || plan.Bundles[0].SlotID != p.SlotID || plan.Bundles[0].GPUPCI != p.GPUPCI ||
		plan.Bundles[0].FabricVFPCI != p.FabricVF || plan.AllocationID != "validate-"+p.SlotID:
		return fail("burn-in plan", "the validation VM's plan is not this slot's alone")
	}
	if a.vm == nil {
		return []apiv1.ValidationCheck{{Name: "burn-in VM", Passed: true, Simulated: true, Detail: "sim runtime: no VM booted, no guest checks run"}}
	}
	var checks []apiv1.ValidationCheck
	if _, err := a.vm.host.Provision(ctx, plan, rec); err != nil {
		checks = append(checks, apiv1.ValidationCheck{Name: "burn-in VM boot", Passed: false, Detail: err.Error()})
	} else {
		checks = append(checks, apiv1.ValidationCheck{Name: "burn-in VM boot", Passed: true,
			Detail: fmt.Sprintf("%s booted on the slot's devices from %s", slicevm.VMName(plan.AllocationID), plan.Image.Slug)})
		timeout := time.Duration(p.BurnInTimeoutS) * time.Second
		if timeout <= 0 {
			timeout = defaultBurnInTimeout
		}
		var guest []apiv1.ValidationCheck
		err := rec.RunDetail("burn_in_report", func() (string, error) {
			var err error
			guest, err = a.awaitValidationReport(ctx, plan.AllocationID, timeout)
			return fmt.Sprintf("%d guest checks", len(guest)), err
		})
		if err != nil {
			checks = append(checks, apiv1.ValidationCheck{Name: "guest report", Passed: false, Detail: err.Error()})
		}
		checks = append(checks, guest...)
	}
	// Always: the VM is removed and the disk it booted from wiped, after a failed boot too.
	ro, err := a.vm.host.Release(ctx, &task.VMRelease{AllocationID: plan.AllocationID, Bundles: plan.Bundles, Wipe: true, GracefulTimeoutS: 30}, rec)
	wp, ok := ro.Wiped[p.SlotID]
	switch {
	case err != nil:
		checks = append(checks, apiv1.ValidationCheck{Name: "disk wiped after burn-in", Passed: false, Detail: err.Error()})
	case !ok || !wp.Verified:
		checks = append(checks, apiv1.ValidationCheck{Name: "disk wiped after burn-in", Passed: false, Detail: "the slot's disk was not wiped and verified: " + wp.Error})
	default:
		checks = append(checks, apiv1.ValidationCheck{Name: "disk wiped after burn-in", Passed: true, Detail: "verified (" + wp.Method + ")"})
	}
	return checks
}

// awaitValidationReport waits for the validation VM's report (the guest's validation script
// posts it to the telemetry endpoint with the VM's token) and turns it into checks.
func (a *Agent) awaitValidationReport(ctx context.Context, allocationID string, timeout time.Duration) ([]apiv1.ValidationCheck, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if rep, ok := a.vm.telemetry.Latest(allocationID); ok {
			if checks, err := GuestValidationChecks(rep.Body); err == nil {
				return checks, nil
			} else if err != errNoValidation {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			return nil, fmt.Errorf("no validation report from the guest within %s", timeout)
		case <-tick.C:
		}
	}
}

// errNoValidation is a telemetry report without a validation part (the guest's helper's).
var errNoValidation = fmt.Errorf("no validation part")

// maxGuestChecks bounds what one validation report can add to a slot's evidence.
const maxGuestChecks = 8

// GuestValidationChecks reads a validation VM's report ({"validation": {"checks": [{"name",
// "result", "detail"}]}}, docs/health.md). Results: passed; failed; no_gpu (the guest has no
// GPU to check: passes as simulated, never as ok); not_installed (dcgmi absent: skipped). A
// report without checks, or with an unknown result, is a failed validation.
func GuestValidationChecks(body []byte) ([]apiv1.ValidationCheck, error) {
	var r struct {
		Validation *struct {
			Checks []struct {
				Name   string `json:"name"`
				Result string `json:"result"`
				Detail string `json:"detail"`
			} `json:"checks"`
		} `json:"validation"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("the guest's report is not JSON: %v", err)
	}
	if r.Validation == nil {
		return nil, errNoValidation
	}
	if len(r.Validation.Checks) == 0 {
		return nil, fmt.Errorf("the guest's validation report has no checks")
	}
	var out []apiv1.ValidationCheck
	for i, c := range r.Validation.Checks {
		if i == maxGuestChecks {
			break
		}
		name, detail := "guest "+clip(c.Name, 64), clip(c.Detail, 300)
		switch c.Result {
		case "passed":
			out = append(out, apiv1.ValidationCheck{Name: name, Passed: true, Detail: detail})
		case "failed":
			out = append(out, apiv1.ValidationCheck{Name: name, Passed: false, Detail: detail})
		case "no_gpu":
			out = append(out, apiv1.ValidationCheck{Name: name, Passed: true, Simulated: true, Detail: detail})
		case "not_installed":
			out = append(out, apiv1.ValidationCheck{Name: name, Passed: true, Skipped: true, Detail: detail})
		default:
			out = append(out, apiv1.ValidationCheck{Name: name, Passed: false, Detail: fmt.Sprintf("unknown result %q", clip(c.Result, 32))})
		}
	}
	return out, nil
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
