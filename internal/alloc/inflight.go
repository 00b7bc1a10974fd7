package alloc

import (
	"slices"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/sched"
	"github.com/gpuaas/gpuaas/internal/store"
)

// inFlight is the slots this replica's reservations have locked and not yet committed or
// rolled back. Until that transaction ends, every other one still reads them as available, so
// a concurrent request of this replica ranks them like any free slot, and when its choice
// needs them (a 4-GPU request wanting the same NUMA group) its lock finds too few and it
// loses the race: one wasted lock round trip per collision (at 16 clients, 2.3 lock
// statements per create). A request therefore tries first the choices whose NUMA groups still
// have enough slots that nobody here holds, in ranking order. Nothing is held when requests
// come one at a time, so placement itself is unchanged; another replica's locks are found by
// SKIP LOCKED as before.
//
// A committed reservation is remembered for a while too (recent): a window whose statement was
// sent before that commit returned may still show its slots as free, and a lock of them would
// find them reserved. Like a scheduler's assumed placements, those slots count as held for
// such a window, and for no window sent after the commit: by then the database shows them
// reserved, or free again if the allocation was released meanwhile. With this, the slots a
// lost race left locked held too, and choices this view says are taken skipped instead of
// locked (Service.reserve), a create at 64 clients sends 1.00 lock statements (1.4-1.6 before).
type inFlight struct {
	mu     sync.Mutex
	slots  map[string]int       // slot id -> reservations holding it (normally 0 or 1)
	recent map[string]time.Time // slot id -> when the reservation that took it committed
	byAge  []recentSlot         // recent, oldest first, for forgetting
}

type recentSlot struct {
	id string
	at time.Time
}

// recentFor is how long a commit is remembered: longer than a create transaction lives (its
// windows are read inside it), so no window that could have missed the commit outlives it.
const recentFor = 10 * time.Second

// committed gives back the slots hold recorded for a transaction that committed at and, in
// the same step (no other request may claim them in between as free), remembers those it
// reserved as taken for windows sent before then.
func (f *inFlight) committed(locked, reserved []string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releaseLocked(locked)
	if f.recent == nil {
		f.recent = map[string]time.Time{}
	}
	for _, id := range reserved {
		f.recent[id] = at
		f.byAge = append(f.byAge, recentSlot{id, at})
	}
	n := 0
	for n < len(f.byAge) && at.Sub(f.byAge[n].at) > recentFor {
		if e := f.byAge[n]; f.recent[e.id] == e.at {
			delete(f.recent, e.id)
		}
		n++
	}
	f.byAge = f.byAge[n:]
}

// taken reports whether slot id is held here, or was reserved by a commit that returned after
// since (when the window it was read from was sent).
func (f *inFlight) taken(id string, since time.Time) bool {
	if f.slots[id] > 0 {
		return true
	}
	at, ok := f.recent[id]
	return ok && at.After(since)
}

// heldByOthers drops from cands the slots another reservation of this replica holds (own
// are the slots the asking transaction locked itself, freed when it ends): they read as
// available until that reservation ends, which nearly always commits them.
func (f *inFlight) heldByOthers(cands []store.CandidateSlot, own []string) []store.CandidateSlot {
	f.mu.Lock()
	defer f.mu.Unlock()
	mine := map[string]int{}
	for _, id := range own {
		mine[id]++
	}
	kept := cands[:0:0]
	for _, c := range cands {
		if f.slots[c.SlotID]-mine[c.SlotID] <= 0 {
			kept = append(kept, c)
		}
	}
	return kept
}

// hold records slots as locked by a reservation in progress.
func (f *inFlight) hold(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.slots == nil {
		f.slots = map[string]int{}
	}
	for _, id := range ids {
		f.slots[id]++
	}
}

// release forgets slots hold recorded, once their transaction has ended.
func (f *inFlight) release(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releaseLocked(ids)
}

func (f *inFlight) releaseLocked(ids []string) {
	for _, id := range ids {
		if f.slots[id] <= 1 {
			delete(f.slots, id)
		} else {
			f.slots[id]--
		}
	}
}

// order returns choices with those that can still be locked without a held slot first, each
// part in its given order. A choice can be when its alternates (the slots lockChoice may take
// for it) include enough that nobody here holds (taken: cands come from a window sent at since).
func (f *inFlight) order(choices []sched.Choice, cands []store.CandidateSlot, since time.Time) []sched.Choice {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.slots) == 0 && len(f.recent) == 0 {
		return choices
	}
	// Each choice's alternates come from its own node's candidates: the fleet-wide fallback
	// ranks thousands of choices over tens of thousands of candidates.
	byNode := map[string][]store.CandidateSlot{}
	for _, c := range cands {
		byNode[c.NodeID] = append(byNode[c.NodeID], c)
	}
	var clear, held []sched.Choice
	for _, ch := range choices {
		free := 0
		for _, id := range alternates(ch, byNode[ch.NodeID]) {
			if !f.taken(id, since) {
				free++
			}
		}
		if free >= len(ch.SlotIDs) {
			clear = append(clear, ch)
		} else {
			held = append(held, ch)
		}
	}
	return append(clear, held...)
}

// claim holds, for a choice about to be locked, as many of its alternates as it needs that
// nobody here holds, its own slots first, and returns them with every unheld alternate (what
// the lock may take instead). It checks and holds at once, so two requests of this replica
// that rank the same choice at the same moment lock disjoint slots of its NUMA groups instead
// of racing for the same ones (order alone only sees locks already taken). When too few are
// free it holds nothing and returns nil: the caller locks the choice as ranked (a holder may
// yet fail). release gives back what claim held. since is when the window alts come from was
// sent (see taken).
func (f *inFlight) claim(ch sched.Choice, alts []string, since time.Time) (picked, free []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.slots == nil {
		f.slots = map[string]int{}
	}
	for _, id := range alts {
		if !f.taken(id, since) {
			free = append(free, id)
		}
	}
	if len(free) < len(ch.SlotIDs) {
		return nil, nil
	}
	for _, id := range ch.SlotIDs {
		if slices.Contains(free, id) {
			picked = append(picked, id)
		}
	}
	for _, id := range free {
		if len(picked) == len(ch.SlotIDs) {
			break
		}
		if !slices.Contains(picked, id) {
			picked = append(picked, id)
		}
	}
	for _, id := range picked {
		f.slots[id]++
	}
	return picked, free
}

// alternates is the slots lockChoice may lock for a choice: the free candidate slots of the
// same node and NUMA groups (a full-host choice, or one without enough of them, has only its
// own). cands may be every candidate or only the choice's node's.
func alternates(ch sched.Choice, cands []store.CandidateSlot) []string {
	if len(ch.NUMANodes) == 0 {
		return ch.SlotIDs
	}
	var alts []string
	for _, c := range cands {
		if c.NodeID == ch.NodeID && slices.Contains(ch.NUMANodes, max(c.NUMANode, -1)) {
			alts = append(alts, c.SlotID)
		}
	}
	if len(alts) < len(ch.SlotIDs) {
		return ch.SlotIDs
	}
	return alts
}
