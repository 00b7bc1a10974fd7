package slicevm

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Reconciler is a runtime that can compare the controller's view with the host (seed 001
// "Slice Drift Reconciliation").
type Reconciler interface {
	Reconcile(ctx context.Context, p *task.Reconcile) (task.ReconcileReport, error)
}

// Reconcile checks, per expected slot: the domain exists and runs (for active allocations),
// the slot's lease is held by its allocation, the boot MAC's DHCP reservation exists, the
// disk is a block device and not mounted, and (production) the GPU and VF sit on vfio-pci
// and are attached to the running domain;
// each slot also carries when its guest last reported telemetry. It also lists gpuaas-* domains, leases and reservations that no live allocation accounts for.
// It only reads: repairing is the controller's decision.
func (h *Host) Reconcile(ctx context.Context, p *task.Reconcile) (task.ReconcileReport, error) {
	rep := task.ReconcileReport{Runtime: h.Name(), Slots: []task.SlotDrift{}, OrphanDomains: []string{}, OrphanLeases: []string{},
		OrphanReservations: []string{}, CheckedAt: time.Now().UTC()}
	held, err := h.cfg.Leases.Held()
	if err != nil {
		return rep, err
	}
	leaseOf := map[string]string{} // slot id -> allocation id
	for _, l := range held {
		leaseOf[l.SlotID] = l.AllocationID
	}
	reserved := map[string]string{} // MAC -> allocation id
	for _, r := range h.cfg.DHCP.Reservations() {
		reserved[strings.ToLower(r.MAC)] = r.AllocationID
	}
	domains, err := h.cfg.Hypervisor.List("gpuaas-")
	if err != nil {
		return rep, err
	}
	live := map[string]bool{}
	liveSlots := map[string]bool{}
	liveMACs := map[string]bool{}
	w := disk.Wiper{FS: h.cfg.FS, Run: h.cfg.Run}
	for _, a := range p.Allocations {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		name := VMName(a.AllocationID)
		live[name] = true
		st, err := h.cfg.Hypervisor.State(name)
		if err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			return rep, err
		}
		if st == "" {
			st = hypervisor.NotFound
		}
		// The devices the running domain really holds: a GPU or VF detached from it (by hand,
		// or a hot-unplug after a device fault) is drift of its slot.
		// A device gone from the persistent definition only would be gone after a restart.
		attached, defined := map[string]bool{}, map[string]bool{}
		hostdevsKnown := false
		if !h.cfg.Lab && st == hypervisor.Running {
			if live, config, err := h.cfg.Hypervisor.PCIHostdevs(name); err == nil {
				hostdevsKnown = true
				for _, a := range live {
					attached[a] = true
				}
				for _, a := range config {
					defined[a] = true
				}
			}
		}
		var heard *time.Time
		if r, ok := h.cfg.Telemetry.Latest(a.AllocationID); ok {
			heard = &r.ReceivedAt
		}
		for i, b := range a.Bundles {
			liveSlots[b.SlotID] = true
			sd := task.SlotDrift{SlotID: b.SlotID, SlotIndex: b.SlotIndex, AllocationID: a.AllocationID, DomainState: string(st), GuestTelemetryAt: heard}
			if a.Status == "active" && st != hypervisor.Running {
				sd.Drift = append(sd.Drift, "domain "+name+" is "+string(st)+", the allocation is active")
			}
			switch owner := leaseOf[b.SlotID]; {
			case owner == "" && a.Status == "active":
				sd.Drift = append(sd.Drift, "no node-scheduler lease for the slot")
			case owner != "" && owner != a.AllocationID:
				sd.Drift = append(sd.Drift, "slot leased by allocation "+owner)
			}
			if i == 0 && b.MACAddress != "" {
				mac := strings.ToLower(b.MACAddress)
				liveMACs[mac] = true
				if owner, ok := reserved[mac]; a.Status == "active" && !ok {
					sd.Drift = append(sd.Drift, "no DHCP reservation for "+b.MACAddress)
				} else if ok && owner != a.AllocationID {
					sd.Drift = append(sd.Drift, "DHCP reservation of "+b.MACAddress+" belongs to allocation "+owner)
				}
			}
			if _, err := w.Resolve(b.NVMeDevice); err != nil {
				sd.Drift = append(sd.Drift, "disk: "+err.Error())
			}
			if !h.cfg.Lab {
				for _, addr := range []string{b.GPUPCI, b.FabricVFPCI} {
					if d := h.cfg.FS.LinkBase("/sys/bus/pci/devices/" + addr + "/driver"); d != "vfio-pci" {
						sd.Drift = append(sd.Drift, addr+" is on driver "+quoteOr(d, "none")+", not vfio-pci")
					}
					switch {
					case !hostdevsKnown || addr == "":
					case !attached[addr]:
						sd.Drift = append(sd.Drift, addr+" is not attached to domain "+name)
					case !defined[addr]:
						sd.Drift = append(sd.Drift, addr+" is attached to domain "+name+" but gone from its definition (a restart would lose it)")
					}
				}
			}
			rep.Slots = append(rep.Slots, sd)
		}
	}
	for _, d := range domains {
		if !live[d] && strings.HasPrefix(d, "gpuaas-") {
			rep.OrphanDomains = append(rep.OrphanDomains, d)
		}
	}
	for slot := range leaseOf {
		if !liveSlots[slot] {
			rep.OrphanLeases = append(rep.OrphanLeases, slot)
		}
	}
	for mac := range reserved {
		if !liveMACs[mac] {
			rep.OrphanReservations = append(rep.OrphanReservations, mac)
		}
	}
	sort.Strings(rep.OrphanDomains)
	sort.Strings(rep.OrphanLeases)
	sort.Strings(rep.OrphanReservations)
	return rep, nil
}

func quoteOr(s, empty string) string {
	if s == "" {
		return empty
	}
	return `"` + s + `"`
}

// Reconcile in the sim runtime has no host objects to compare: every expected slot is
// reported as it is expected, labelled simulated.
func (Sim) Reconcile(_ context.Context, p *task.Reconcile) (task.ReconcileReport, error) {
	rep := task.ReconcileReport{Runtime: "sim", Simulated: true, Slots: []task.SlotDrift{}, OrphanDomains: []string{}, OrphanLeases: []string{},
		OrphanReservations: []string{}, CheckedAt: time.Now().UTC()}
	for _, a := range p.Allocations {
		for _, b := range a.Bundles {
			rep.Slots = append(rep.Slots, task.SlotDrift{SlotID: b.SlotID, SlotIndex: b.SlotIndex, AllocationID: a.AllocationID, DomainState: "simulated"})
		}
	}
	return rep, nil
}
