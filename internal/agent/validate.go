package agent

import (
	"context"
	"fmt"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/health"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
)

// validateSlot runs a slot.validate (the quick checks, then at level burn-in the validation
// VM: burnIn) after the host's own check that nothing here uses the
// slot: the controller refuses to validate a slot a live allocation holds, and the host
// refuses too, whatever the controller believed, because the validation resets the slot's
// devices. A slot is in use when a process (a VM's QEMU) holds the VFIO group of its GPU or
// fabric VF open, or when a live slice's lease on this host holds the slot or its devices. A
// refusal fails the task: the controller records a failed validation and the slot stays out
// of sale until an operator looks. leased is the host's slice lease directory (nil: none).
func (a *Agent) validateSlot(ctx context.Context, p *task.SlotValidate, leased *leases.Dir, rec *slicevm.Recorder) (health.ValidationResult, error) {
	functions := []string{p.GPUPCI, p.FabricVF}
	if held := health.HeldOpen(a.host, functions); len(held) > 0 {
		return health.ValidationResult{}, fmt.Errorf("refused on the host: the slot's devices are in use: %s", strings.Join(held, "; "))
	}
	if leased != nil {
		alloc, err := leased.HolderOf(p.SlotID, p.GPUPCI, p.FabricVF)
		if err != nil {
			return health.ValidationResult{}, fmt.Errorf("refused on the host: cannot read the slice leases: %w", err)
		}
		if alloc != "" {
			return health.ValidationResult{}, fmt.Errorf("refused on the host: allocation %s holds a live lease on the slot", alloc)
		}
	}
	var res health.ValidationResult
	if a.runtime.Name() == "lab" {
		// Lab slots name stand-in PCI functions (the lab host has no GPU or VF): nothing to read.
		res = health.ValidationResult{}.With("quick", []apiv1.ValidationCheck{{Name: "pcie", Passed: true, Simulated: true,
			Detail: "lab runtime: the slot's PCI functions are stand-ins, not read or reset"}})
	} else {
		res = health.Quick(a.host, functions, a.deviceReset())
	}
	switch {
	case p.Level != "burn-in":
		return res, nil
	case !res.Passed:
		return res.With("burn-in", []apiv1.ValidationCheck{{Name: "burn-in VM", Passed: false, Detail: "not booted: the quick checks failed"}}), nil
	}
	return res.With("burn-in", a.burnIn(ctx, p, rec)), nil
}

// slotLeases is the slice lease directory of the lab and libvirt runtimes (nil on sim, which
// leases nothing).
func (a *Agent) slotLeases() *leases.Dir {
	if a.vm == nil {
		return nil
	}
	return a.vm.host.Leases()
}
