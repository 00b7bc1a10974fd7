// Package leases is the node scheduler's host-local race guard (seed 004): before a task
// touches a slot's devices it takes a lease file per slot under
// /var/lib/gpuaas/node-scheduler/leases/{slot_id}.json (0600) naming the allocation, task,
// slot ids, device identities and expiry. Two tasks can never hold the same slot or device;
// expired leases are reclaimed. hostd renews the leases of live slices (Renew) well before
// they expire, so a slice keeps its leases for as long as it lives. The leases are not the durable record (the controller's
// claims are); they keep concurrent tasks on one host apart.
package leases

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// DefaultTTL and the clamp of GPUAAS_NODE_SCHEDULER_LEASE_TTL_SECONDS (seed 000).
const (
	DefaultTTL = 86400 * time.Second
	MinTTL     = 300 * time.Second
	MaxTTL     = 604800 * time.Second
)

// TTLFromEnv reads GPUAAS_NODE_SCHEDULER_LEASE_TTL_SECONDS, clamped to [300, 604800].
func TTLFromEnv(getenv func(string) string) time.Duration {
	v, err := strconv.Atoi(getenv("GPUAAS_NODE_SCHEDULER_LEASE_TTL_SECONDS"))
	if err != nil || v <= 0 {
		return DefaultTTL
	}
	return min(max(time.Duration(v)*time.Second, MinTTL), MaxTTL)
}

// Lease is one slot's lease file.
type Lease struct {
	SlotID       string    `json:"slot_id"`
	AllocationID string    `json:"allocation_id"`
	TaskID       string    `json:"task_id"`
	SlotIDs      []string  `json:"slot_ids"`
	Devices      []string  `json:"devices"` // GPU PCI, VF PCI, NVMe by-id of this slot
	AcquiredAt   time.Time `json:"acquired_at"`
	ExpiresAt    time.Time `json:"expires_at"`
}

// Request asks for the leases of one task's slots.
type Request struct {
	AllocationID string
	TaskID       string
	Slots        map[string][]string // slot id -> its device identities
}

// ErrHeld is a slot or device leased by another allocation.
var ErrHeld = errors.New("lease held")

// Dir manages the lease directory.
type Dir struct {
	Path string
	TTL  time.Duration
	Now  func() time.Time
	mu   sync.Mutex // serializes acquisition within this process; O_EXCL files across processes
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func (d *Dir) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

func (d *Dir) path(slot string) string { return filepath.Join(d.Path, slot+".json") }

// read returns the live lease of a slot, reclaiming an expired one.
func (d *Dir) read(slot string) (*Lease, error) {
	b, err := os.ReadFile(d.path(slot))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var l Lease
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("lease %s is corrupt (refusing to guess): %w", slot, err)
	}
	if !d.now().Before(l.ExpiresAt) {
		if err := os.Remove(d.path(slot)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, nil // expired: reclaimed
	}
	return &l, nil
}

// Acquire leases every slot of the request or none. Re-acquiring leases the same allocation
// already holds renews them (a retried task is idempotent). A slot or device held by another
// allocation fails with ErrHeld.
func (d *Dir) Acquire(r Request) ([]Lease, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !idRE.MatchString(r.AllocationID) || !idRE.MatchString(r.TaskID) || len(r.Slots) == 0 {
		return nil, fmt.Errorf("lease request needs allocation id, task id and slots")
	}
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return nil, err
	}
	// Devices leased by other allocations (any slot file may name them).
	entries, err := os.ReadDir(d.Path)
	if err != nil {
		return nil, err
	}
	held := map[string]string{}
	for _, e := range entries {
		slot := filepath.Base(e.Name())
		if filepath.Ext(slot) != ".json" {
			continue
		}
		l, err := d.read(slot[:len(slot)-5])
		if err != nil {
			return nil, err
		}
		if l == nil || l.AllocationID == r.AllocationID {
			continue
		}
		held["slot:"+l.SlotID] = l.AllocationID
		for _, dev := range l.Devices {
			held[dev] = l.AllocationID
		}
	}
	var slots []string
	for s, devs := range r.Slots {
		if !idRE.MatchString(s) {
			return nil, fmt.Errorf("slot id %q is not a safe file name", s)
		}
		if a, ok := held["slot:"+s]; ok {
			return nil, fmt.Errorf("%w: slot %s by allocation %s", ErrHeld, s, a)
		}
		for _, dev := range devs {
			if a, ok := held[dev]; ok {
				return nil, fmt.Errorf("%w: device %s by allocation %s", ErrHeld, dev, a)
			}
		}
		slots = append(slots, s)
	}
	now := d.now().UTC()
	var out []Lease
	for _, s := range slots {
		l := Lease{SlotID: s, AllocationID: r.AllocationID, TaskID: r.TaskID, SlotIDs: slots, Devices: r.Slots[s],
			AcquiredAt: now, ExpiresAt: now.Add(d.ttl())}
		if err := d.write(l); err != nil {
			d.release(out)
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

func (d *Dir) ttl() time.Duration {
	if d.TTL > 0 {
		return d.TTL
	}
	return DefaultTTL
}

// write stores a lease file atomically (0600).
func (d *Dir) write(l Lease) error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.path(l.SlotID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, d.path(l.SlotID))
}

// Renew extends every live lease of the allocation to a full TTL from now and returns how
// many it extended. A lease that has already expired is not revived: another task may have
// taken the slot since.
func (d *Dir) Renew(allocationID string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	until := d.now().UTC().Add(d.ttl())
	for _, e := range entries {
		name := e.Name()
		if filepath.Ext(name) != ".json" {
			continue
		}
		l, err := d.read(name[:len(name)-5])
		if err != nil {
			return n, err
		}
		if l == nil || l.AllocationID != allocationID || !until.After(l.ExpiresAt) {
			continue
		}
		l.ExpiresAt = until
		if err := d.write(*l); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func (d *Dir) release(ls []Lease) {
	for _, l := range ls {
		_ = os.Remove(d.path(l.SlotID))
	}
}

// Release drops the allocation's leases on the given slots; returns how many it removed.
func (d *Dir) Release(allocationID string, slots []string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, s := range slots {
		if !idRE.MatchString(s) {
			continue
		}
		l, err := d.read(s)
		if err != nil {
			return n, err
		}
		if l == nil || l.AllocationID != allocationID {
			continue // not ours (or already gone): never drop another allocation's lease
		}
		if err := os.Remove(d.path(s)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, err
		}
		n++
	}
	return n, nil
}

// Held returns the live leases.
func (d *Dir) Held() ([]Lease, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Lease
	for _, e := range entries {
		name := e.Name()
		if filepath.Ext(name) != ".json" {
			continue
		}
		l, err := d.read(name[:len(name)-5])
		if err != nil {
			return nil, err
		}
		if l != nil {
			out = append(out, *l)
		}
	}
	return out, nil
}

// HolderOf returns the allocation whose live lease holds the slot or any of its devices (""
// when none): a slot leased here belongs to a slice that is provisioning, running or
// releasing on this host.
func (d *Dir) HolderOf(slotID string, devices ...string) (string, error) {
	held, err := d.Held()
	if err != nil {
		return "", err
	}
	for _, l := range held {
		if l.SlotID == slotID {
			return l.AllocationID, nil
		}
		for _, have := range l.Devices {
			for _, want := range devices {
				if want != "" && have == want {
					return l.AllocationID, nil
				}
			}
		}
	}
	return "", nil
}
