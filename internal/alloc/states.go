// Package alloc owns the allocation, slot and claim lifecycles: it turns a request into a
// placement (candidate SQL from store, ranking from sched), reserves it in one transaction,
// resolves the VM profile and image, and moves allocations and slots through their state
// machines. The same transitions are enforced by the database (migration 001).
package alloc

// Allocation states.
const (
	AllocRequested    = "requested"
	AllocProvisioning = "provisioning"
	AllocActive       = "active"
	AllocReleasing    = "releasing"
	AllocReleased     = "released"
	AllocFailed       = "failed"
)

// Slot states.
const (
	SlotAvailable      = "available"
	SlotReserved       = "reserved"
	SlotProvisioning   = "provisioning"
	SlotActive         = "active"
	SlotReleasing      = "releasing"
	SlotCleanup        = "cleanup"
	SlotCleanupBlocked = "cleanup_blocked"
	SlotFailed         = "failed"
	SlotDisabled       = "disabled"
)

// AllocationTransitions is the allocation state machine (mirrored by the allocation_transitions table).
var AllocationTransitions = map[string][]string{
	AllocRequested:    {AllocProvisioning, AllocReleasing, AllocFailed, AllocReleased}, // released: cancelled before its host took anything
	AllocProvisioning: {AllocActive, AllocReleasing, AllocFailed, AllocRequested},      // requested: re-placement after plan_invalid
	AllocActive:       {AllocReleasing, AllocFailed},
	AllocReleasing:    {AllocReleased, AllocFailed},
	AllocFailed:       {AllocReleasing},
}

// SlotTransitions is the slot state machine (mirrored by the slot_transitions table).
// A slot returns to available from cleanup only with wipe proof; reserved -> available is a
// reservation cancelled before any device or disk was touched.
var SlotTransitions = map[string][]string{
	SlotAvailable:      {SlotReserved, SlotDisabled, SlotCleanupBlocked},
	SlotReserved:       {SlotProvisioning, SlotReleasing, SlotAvailable},
	SlotProvisioning:   {SlotActive, SlotReleasing, SlotFailed},
	SlotActive:         {SlotReleasing},
	SlotReleasing:      {SlotCleanup, SlotCleanupBlocked},
	SlotCleanup:        {SlotAvailable, SlotCleanupBlocked},
	SlotCleanupBlocked: {SlotCleanup, SlotDisabled},
	SlotFailed:         {SlotCleanup, SlotCleanupBlocked, SlotDisabled},
	SlotDisabled:       {SlotAvailable},
}

// CanTransition reports whether from -> to is allowed by table.
func CanTransition(table map[string][]string, from, to string) bool {
	for _, s := range table[from] {
		if s == to {
			return true
		}
	}
	return false
}
