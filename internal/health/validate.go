package health

import (
	"fmt"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// ValidationResult is what a quick validation found on one slot's devices.
type ValidationResult struct {
	Level     string                  `json:"level"`
	Passed    bool                    `json:"passed"`
	Simulated bool                    `json:"simulated,omitempty"`
	Checks    []apiv1.ValidationCheck `json:"checks"`
	Summary   string                  `json:"summary"`
}

// Quick validates the slot's PCI functions (its GPU and, where it has one, its fabric VF):
// present, config space readable, link at full width, no AER fatal or non-fatal errors
// counted, and a function reset read back. reset performs the reset of one function (writing
// its sysfs "reset" attribute); nil means this host cannot reset devices (the sim and lab
// runtimes: the check says "simulated", never "ok").
func Quick(fs hostfs.FS, functions []string, reset func(addr string) error) ValidationResult {
	res := ValidationResult{Level: "quick", Passed: true}
	add := func(c apiv1.ValidationCheck) {
		res.Checks = append(res.Checks, c)
		if !c.Passed {
			res.Passed = false
		}
		if c.Simulated {
			res.Simulated = true
		}
	}
	for _, addr := range functions {
		if addr == "" {
			continue
		}
		r := ReadPCIe(fs, addr)
		for _, f := range r.Findings(nil, "") {
			switch f.Signal {
			case "pcie:aer_correctable_rising":
				continue // correctable errors are recorded, not failed
			}
			add(apiv1.ValidationCheck{Name: addr + " " + f.Signal, Passed: false, Detail: f.Detail})
		}
		if !r.Present || !r.ConfigReadable || r.VendorID == 0xffff {
			continue // nothing to reset
		}
		add(apiv1.ValidationCheck{Name: addr + " pcie", Passed: true,
			Detail: fmt.Sprintf("vendor 0x%04x, link x%d of x%d", r.VendorID, r.CurWidth, r.MaxWidth)})
		if reset == nil {
			add(apiv1.ValidationCheck{Name: addr + " reset", Passed: true, Simulated: true, Detail: "no device reset on this runtime"})
			continue
		}
		if err := reset(addr); err != nil {
			add(apiv1.ValidationCheck{Name: addr + " reset", Passed: false, Detail: err.Error()})
			continue
		}
		after := ReadPCIe(fs, addr)
		ok := after.ConfigReadable && after.VendorID == r.VendorID
		add(apiv1.ValidationCheck{Name: addr + " reset", Passed: ok, Detail: fmt.Sprintf("config space after reset: vendor 0x%04x", after.VendorID)})
	}
	if len(res.Checks) == 0 {
		add(apiv1.ValidationCheck{Name: "devices", Passed: false, Detail: "the slot names no PCI function"})
	}
	res.summarize()
	return res
}

// With returns the result with more checks (a burn-in's after the quick ones) at level, its
// verdict and summary made again from all of them.
func (r ValidationResult) With(level string, checks []apiv1.ValidationCheck) ValidationResult {
	r.Level = level
	r.Checks = append(append([]apiv1.ValidationCheck(nil), r.Checks...), checks...)
	r.summarize()
	return r
}

// summarize sets the verdict from the checks: passed when every check passed, simulated when
// any check was (a step this host could not really run).
func (r *ValidationResult) summarize() {
	r.Passed, r.Simulated = len(r.Checks) > 0, false
	var failed []string
	for _, c := range r.Checks {
		if !c.Passed {
			r.Passed = false
			failed = append(failed, c.Name)
		}
		if c.Simulated {
			r.Simulated = true
		}
	}
	if !r.Passed {
		r.Summary = "failed: " + strings.Join(failed, ", ")
		return
	}
	r.Summary = fmt.Sprintf("%d checks passed", len(r.Checks))
	if r.Simulated {
		r.Summary += " (some simulated: see the checks)"
	}
}
