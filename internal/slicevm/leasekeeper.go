package slicevm

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/gpuaas/gpuaas/internal/leases"
)

// working marks a provision or release of the allocation as running here until the returned
// func is called: its leases are renewed even before its slice directory exists (provision)
// or after it is gone (a release still wiping).
func (h *Host) working(allocationID string) func() {
	h.mu.Lock()
	h.busy[allocationID]++
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		if h.busy[allocationID]--; h.busy[allocationID] <= 0 {
			delete(h.busy, allocationID)
		}
		h.mu.Unlock()
	}
}

// live says whether an allocation's slice lives on this host: a provision or release of it
// runs here, or its slice directory exists (provisioning creates it, release removes it, and
// it outlives a hostd restart).
func (h *Host) live(allocationID string) bool {
	h.mu.Lock()
	busy := h.busy[allocationID] > 0
	h.mu.Unlock()
	if busy {
		return true
	}
	_, err := os.Stat(h.SliceDir(allocationID))
	return err == nil
}

// RenewLeases extends the node-scheduler leases of every live slice to a full TTL and
// returns how many it extended. Leases of an allocation that no longer lives here (slots
// whose disk failed its wipe at release) are left to run out.
func (h *Host) RenewLeases() (int, error) {
	held, err := h.cfg.Leases.Held()
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	n := 0
	var errs error
	for _, l := range held {
		if seen[l.AllocationID] {
			continue
		}
		seen[l.AllocationID] = true
		if !h.live(l.AllocationID) {
			continue
		}
		k, err := h.cfg.Leases.Renew(l.AllocationID)
		n += k
		errs = errors.Join(errs, err)
	}
	return n, errs
}

// KeepLeases renews the leases of live slices every third of the lease TTL until ctx ends,
// so a slice never loses its leases while it lives, however long that is.
func (h *Host) KeepLeases(ctx context.Context) {
	ttl := h.cfg.Leases.TTL
	if ttl <= 0 {
		ttl = leases.DefaultTTL
	}
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		if _, err := h.RenewLeases(); err != nil {
			h.cfg.Log.Error("renewing node-scheduler leases", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Leases is the host's slice lease directory (hostd's own checks read who holds a slot).
func (h *Host) Leases() *leases.Dir { return h.cfg.Leases }
