package agent

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/health"
	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// healthLoop reads the host's device health every HealthInterval and sends what changed to the
// controller, which maps each reading to its slot and applies the policy table. nvidia-smi is
// asked only on the libvirt runtime (a real host); the sim and lab runtimes have no GPU.
func (a *Agent) healthLoop(ctx context.Context) {
	sc := &health.Scanner{FS: a.host}
	if a.runtime.Name() == "libvirt" {
		sc.Run = hostfs.Exec{}
	}
	defer sc.Close()
	t := time.NewTicker(a.cfg.HealthInterval)
	defer t.Stop()
	var pending []health.Finding // not yet delivered: sent again with the next scan's
	scan := true
	for {
		if scan {
			pending = append(pending, sc.Scan(ctx)...)
		}
		if len(pending) > maxPendingHealth {
			pending = pending[len(pending)-maxPendingHealth:]
		}
		if len(pending) > 0 && a.sendHealth(ctx, pending) {
			pending = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			scan = true
		case g := <-a.guestHealth:
			pending, scan = append(pending, g...), false
		}
	}
}

// guestMinInterval is how often one allocation's guest readings are taken: a guest belongs to
// its tenant and may post as often as it likes; its readings reach only its own slots.
const guestMinInterval = 30 * time.Second

// guestReport takes the health part of a guest's telemetry report (telemetry.Registry's
// OnReport) to the health loop, at most once per guestMinInterval per allocation; a reading
// that does not fit the loop's queue is dropped (the guest reports again).
func (a *Agent) guestReport(allocationID string, body []byte) {
	fs := health.GuestFindings(allocationID, body)
	if len(fs) == 0 {
		return
	}
	a.guestMu.Lock()
	if last, ok := a.guestLast[allocationID]; ok && time.Since(last) < guestMinInterval {
		a.guestMu.Unlock()
		return
	}
	if len(a.guestLast) > 4096 { // forget allocations long quiet (released ones among them)
		for id, t := range a.guestLast {
			if time.Since(t) > time.Hour {
				delete(a.guestLast, id)
			}
		}
	}
	a.guestLast[allocationID] = time.Now()
	a.guestMu.Unlock()
	select {
	case a.guestHealth <- fs:
	default:
	}
}

// maxPendingHealth bounds the findings kept while the controller cannot be reached (the
// controller takes 256 a report).
const maxPendingHealth = 256

// sendHealth posts findings and reports whether the controller answered. A reading it refused
// (a device no slot holds) is logged by the controller's answer, not sent again.
func (a *Agent) sendHealth(ctx context.Context, fs []health.Finding) bool {
	rep := apiv1.HealthReport{}
	for _, f := range fs {
		rep.Signals = append(rep.Signals, apiv1.HealthSignal{PCIAddress: f.PCIAddress, AllocationID: f.AllocationID, GPUIndex: f.GPUIndex,
			NVMeDevices: f.NVMeAliases,
			Source:      f.Source, Signal: f.Signal, Detail: f.Detail, Evidence: f.Evidence})
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, data, err := a.do(hctx, "POST", "/api/v1/agent/health", rep)
	if err != nil {
		a.log.Warn("health report not delivered; kept for the next scan", "signals", len(fs), "err", err)
		return false
	}
	if resp.StatusCode >= 500 {
		a.log.Warn("health report not taken; kept for the next scan", "err", apiError(resp, data))
		return false
	}
	if resp.StatusCode >= 300 {
		a.log.Warn("health report refused", "err", apiError(resp, data))
		return true
	}
	a.log.Info("health report sent", "signals", len(fs), "answer", string(data))
	return true
}

// deviceReset resets one PCI function through its sysfs "reset" attribute, on the libvirt
// runtime (a real host, the function idle on vfio-pci); the sim and lab runtimes have no
// device to reset and return nil, so validation says the reset was simulated.
func (a *Agent) deviceReset() func(addr string) error {
	if a.runtime.Name() != "libvirt" {
		return nil
	}
	return func(addr string) error {
		p, err := a.host.Path("/sys/bus/pci/devices/" + addr + "/reset")
		if err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte("1"), 0); err != nil {
			return fmt.Errorf("reset %s: %w", addr, err)
		}
		return nil
	}
}
