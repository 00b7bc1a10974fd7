package alloc

import (
	"slices"
	"testing"

	"github.com/gpuaas/gpuaas/internal/sched"
)

// Requests of one replica that rank the same choice at once claim disjoint slots of its NUMA
// group, its own slots first; when too few are left the claim holds nothing.
func TestClaimGivesConcurrentRequestsDisjointSlots(t *testing.T) {
	var f inFlight
	group := []string{"s0", "s1", "s2", "s3", "s4", "s5"} // one NUMA group's free candidates
	ch := sched.Choice{NodeID: "n", SlotIDs: []string{"s2", "s3"}, NUMANodes: []int{0}}
	a, freeA := f.claim(ch, group)
	if !slices.Equal(a, []string{"s2", "s3"}) || len(freeA) != 6 {
		t.Fatalf("first claim = %v (free %v), want the choice's own slots [s2 s3] of 6 free", a, freeA)
	}
	b, freeB := f.claim(ch, group)
	if len(b) != 2 || slices.Contains(b, "s2") || slices.Contains(b, "s3") {
		t.Fatalf("second claim = %v, want two slots other than the first claim's", b)
	}
	if slices.Contains(freeB, "s2") || slices.Contains(freeB, "s3") || len(freeB) != 4 {
		t.Fatalf("second claim's free alternates = %v, want the 4 unclaimed", freeB)
	}
	c, _ := f.claim(ch, group)
	if len(c) != 2 || slices.ContainsFunc(c, func(id string) bool { return slices.Contains(a, id) || slices.Contains(b, id) }) {
		t.Fatalf("third claim = %v, want the last two free slots", c)
	}
	if d, free := f.claim(ch, group); d != nil || free != nil {
		t.Fatalf("fourth claim = %v (free %v), want nothing: every slot is held", d, free)
	}
	f.release(b)
	if d, _ := f.claim(ch, group); len(d) != 2 || !slices.Equal(d, b) {
		t.Fatalf("after the second claim is given back, a claim = %v, want %v", d, b)
	}
	// A full-host choice's alternates are its own slots only: held, nothing to claim.
	host := sched.Choice{NodeID: "n", SlotIDs: group}
	if d, _ := f.claim(host, alternates(host, nil)); d != nil {
		t.Fatalf("full-host claim over held slots = %v, want nothing", d)
	}
}
