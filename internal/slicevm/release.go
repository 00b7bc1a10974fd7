package slicevm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Release tears a slice down (seed 000 "Release"): graceful shutdown, hard destroy after the
// graceful timeout, undefine with NVRAM, devices left on vfio-pci, seed dir and DHCP
// reservation removed, each disk wiped and verified when asked, leases released only for
// slots whose disks are clean, telemetry token revoked. Idempotent: a VM already gone is fine.
func (h *Host) Release(ctx context.Context, p *task.VMRelease, rec *Recorder) (task.ReleaseOutput, error) {
	name := VMName(p.AllocationID)
	out := task.ReleaseOutput{Runtime: h.Name(), VMName: name, Wiped: map[string]task.WipeProof{}, SlotCount: len(p.Bundles)}
	defer h.working(p.AllocationID)()
	if len(p.Bundles) == 0 {
		return out, errors.New("release plan has no bundles")
	}
	graceful := time.Duration(p.GracefulTimeoutS) * time.Second
	if graceful <= 0 {
		graceful = 120 * time.Second
	}
	cleanSlots := map[string]bool{}
	var wipeErr error
	steps := []struct {
		name string
		fn   func() (string, error)
	}{
		{"shutdown", func() (string, error) {
			st, err := h.cfg.Hypervisor.State(name)
			if err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
				return "", err
			}
			if !st.Active() {
				return "domain not running (" + string(st) + ")", nil
			}
			// Only a running guest can power off on request; a paused (or otherwise stuck)
			// one is destroyed at once. Either way the domain must be gone from the disks
			// before they are wiped: "in shutdown" is not off.
			why := "domain " + string(st) + ": destroyed"
			if st == hypervisor.Running {
				if err := h.cfg.Hypervisor.Shutdown(name); err != nil {
					h.cfg.Log.Warn("graceful shutdown request failed; destroying", "vm", name, "err", err)
				}
				sctx, cancel := context.WithTimeout(ctx, graceful)
				defer cancel()
				t0 := time.Now()
				if err := poll(sctx, func() error {
					if h.active(name) {
						return errors.New("still running")
					}
					return nil
				}); err == nil {
					return fmt.Sprintf("guest powered off in %.1fs", time.Since(t0).Seconds()), nil
				}
				why = fmt.Sprintf("still running after %s: destroyed", graceful)
			}
			if err := h.cfg.Hypervisor.Destroy(name); err != nil {
				return "", err
			}
			if st, err := h.cfg.Hypervisor.State(name); err != nil || st.Active() {
				return "", fmt.Errorf("domain %s still %s after destroy (%v)", name, st, err)
			}
			out.HardStopped = true
			return why, nil
		}},
		{"undefine", func() (string, error) {
			err := h.cfg.Hypervisor.Undefine(name)
			if errors.Is(err, hypervisor.ErrNotFound) {
				return "no domain defined", nil
			}
			return "undefined with NVRAM", err
		}},
		{"vfio_rebind", func() (string, error) {
			if h.cfg.Lab {
				return "", Skip(labSkip)
			}
			// A device off vfio-pci (a provision that failed before binding it, or a host
			// driver that took it) goes back to vfio-pci where hostd may rebind; otherwise the
			// release fails and the slot waits for an operator: it is never sold on a host
			// driver.
			var bad, rebound []string
			for _, b := range p.Bundles {
				for _, a := range []string{b.GPUPCI, b.FabricVFPCI} {
					d := h.cfg.FS.LinkBase("/sys/bus/pci/devices/" + a + "/driver")
					switch {
					case d == "vfio-pci":
					case h.cfg.VFIOBind && h.rebind(a, d) == nil:
						rebound = append(rebound, a)
					default:
						bad = append(bad, a+"="+d)
					}
				}
			}
			if len(bad) > 0 {
				return "", fmt.Errorf("devices not on vfio-pci after release: %s", strings.Join(bad, ", "))
			}
			if len(rebound) > 0 {
				return "GPUs and VFs stay on vfio-pci (rebound: " + strings.Join(rebound, ", ") + ")", nil
			}
			return "GPUs and VFs stay on vfio-pci", nil
		}},
		{"cloud_init_cleanup", func() (string, error) {
			return h.SliceDir(p.AllocationID) + " removed", os.RemoveAll(h.SliceDir(p.AllocationID))
		}},
		{"dhcp_release", func() (string, error) {
			var macs []string
			for _, b := range p.Bundles {
				if b.MACAddress == "" {
					continue
				}
				if err := h.cfg.DHCP.Release(b.MACAddress); err != nil {
					return "", err
				}
				macs = append(macs, b.MACAddress)
			}
			return "released " + strings.Join(macs, ", "), nil
		}},
		{"wipe_verify", func() (string, error) {
			if !p.Wipe {
				for _, b := range p.Bundles {
					cleanSlots[b.SlotID] = true
				}
				return "", Skip("wipe not requested")
			}
			w := disk.Wiper{FS: h.cfg.FS, Run: h.cfg.Run}
			held, err := h.cfg.Leases.Held()
			if err != nil {
				return "", err
			}
			var done []string
			for _, b := range p.Bundles {
				h.DropStaged(b.SlotID) // whatever was staged on it is about to be erased
				if owner := leasedToOther(held, b, p.AllocationID); owner != "" {
					// The host says another allocation owns this disk: never wipe it.
					out.Wiped[b.SlotID] = task.WipeProof{Error: "refused: " + b.NVMeDevice + " is leased to allocation " + owner}
					wipeErr = errors.Join(wipeErr, fmt.Errorf("slot %d %s: leased to allocation %s", b.SlotIndex, b.NVMeDevice, owner))
					continue
				}
				ev, err := w.WipeWith(ctx, disk.WipeOptions{Device: b.NVMeDevice, Apply: true, Policy: b.WipePolicy, Identity: b.DiskIdentity})
				proof := task.WipeProof{Verified: err == nil && ev.Verified, Method: ev.Method,
					Evidence: fmt.Sprintf("%s (%s, %s): %d bytes, %d sampled, %d non-zero regions, signature after %q", b.NVMeDevice, ev.Resolved, ev.Identity, ev.Bytes, ev.SampledBytes, ev.NonZeroRegions, ev.SignatureAfter)}
				proof.Details, _ = json.Marshal(ev)
				if err != nil {
					proof.Error = err.Error()
				} else if !ev.Verified {
					proof.Error = "not verified: " + ev.Error
				}
				out.Wiped[b.SlotID] = proof
				if proof.Verified {
					cleanSlots[b.SlotID] = true
					done = append(done, b.NVMeDevice)
				} else {
					wipeErr = errors.Join(wipeErr, fmt.Errorf("slot %d %s: %s", b.SlotIndex, b.NVMeDevice, proof.Error))
				}
			}
			if wipeErr != nil {
				return "", wipeErr
			}
			return "wiped and verified: " + strings.Join(done, ", "), nil
		}},
		{"lease_release", func() (string, error) {
			var slots []string
			for _, b := range p.Bundles {
				if cleanSlots[b.SlotID] {
					slots = append(slots, b.SlotID)
				}
			}
			terr := h.cfg.Telemetry.Unregister(p.AllocationID)
			n, err := h.cfg.Leases.Release(p.AllocationID, slots)
			err = errors.Join(err, terr)
			out.LeasesReleased = n
			if len(slots) < len(p.Bundles) {
				return fmt.Sprintf("%d released; slots with unverified disks keep their lease", n), err
			}
			return fmt.Sprintf("%d released", n), err
		}},
	}
	var firstErr error
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		// wipe_verify failing must not stop the lease/telemetry cleanup of clean slots.
		if err := rec.RunDetail(s.name, s.fn); err != nil {
			if s.name != "wipe_verify" {
				return out, fmt.Errorf("%s: %w", s.name, err)
			}
			firstErr = fmt.Errorf("%s: %w", s.name, err)
		}
	}
	out.Released = firstErr == nil
	return out, firstErr
}

// leasedToOther is the allocation other than alloc holding a lease on the bundle's slot or
// any of its devices ("" if none).
func leasedToOther(held []leases.Lease, b task.Bundle, alloc string) string {
	for _, l := range held {
		if l.AllocationID == alloc {
			continue
		}
		if l.SlotID == b.SlotID {
			return l.AllocationID
		}
		for _, d := range l.Devices {
			if d != "" && (d == b.NVMeDevice || d == b.GPUPCI || d == b.FabricVFPCI) {
				return l.AllocationID
			}
		}
	}
	return ""
}
