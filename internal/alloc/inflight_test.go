package alloc

import (
	"slices"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/sched"
)

// Requests of one replica that rank the same choice at once claim disjoint slots of its NUMA
// group, its own slots first; when too few are left the claim holds nothing.
func TestClaimGivesConcurrentRequestsDisjointSlots(t *testing.T) {
	var f inFlight
	now := time.Now()
	group := []string{"s0", "s1", "s2", "s3", "s4", "s5"} // one NUMA group's free candidates
	ch := sched.Choice{NodeID: "n", SlotIDs: []string{"s2", "s3"}, NUMANodes: []int{0}}
	a, freeA := f.claim(ch, group, now)
	if !slices.Equal(a, []string{"s2", "s3"}) || len(freeA) != 6 {
		t.Fatalf("first claim = %v (free %v), want the choice's own slots [s2 s3] of 6 free", a, freeA)
	}
	b, freeB := f.claim(ch, group, now)
	if len(b) != 2 || slices.Contains(b, "s2") || slices.Contains(b, "s3") {
		t.Fatalf("second claim = %v, want two slots other than the first claim's", b)
	}
	if slices.Contains(freeB, "s2") || slices.Contains(freeB, "s3") || len(freeB) != 4 {
		t.Fatalf("second claim's free alternates = %v, want the 4 unclaimed", freeB)
	}
	c, _ := f.claim(ch, group, now)
	if len(c) != 2 || slices.ContainsFunc(c, func(id string) bool { return slices.Contains(a, id) || slices.Contains(b, id) }) {
		t.Fatalf("third claim = %v, want the last two free slots", c)
	}
	if d, free := f.claim(ch, group, now); d != nil || free != nil {
		t.Fatalf("fourth claim = %v (free %v), want nothing: every slot is held", d, free)
	}
	f.release(b)
	if d, _ := f.claim(ch, group, now); len(d) != 2 || !slices.Equal(d, b) {
		t.Fatalf("after the second claim is given back, a claim = %v, want %v", d, b)
	}
	// A full-host choice's alternates are its own slots only: held, nothing to claim.
	host := sched.Choice{NodeID: "n", SlotIDs: group}
	if d, _ := f.claim(host, alternates(host, nil), now); d != nil {
		t.Fatalf("full-host claim over held slots = %v, want nothing", d)
	}
}

// A committed reservation's slots stay taken for windows sent before its commit returned (they
// may still show them as free) and only for those; a rolled-back one leaves nothing behind,
// and commits are forgotten after recentFor.
func TestCommittedSlotsStayTakenForOlderWindows(t *testing.T) {
	var f inFlight
	group := []string{"s0", "s1", "s2", "s3"}
	ch := sched.Choice{NodeID: "n", SlotIDs: []string{"s0", "s1"}, NUMANodes: []int{0}}
	before := time.Now()
	picked, _ := f.claim(ch, group, before)
	if !slices.Equal(picked, []string{"s0", "s1"}) {
		t.Fatalf("claim = %v, want [s0 s1]", picked)
	}
	commit := before.Add(time.Millisecond)
	f.committed(picked, picked, commit)
	if f.slots["s0"] != 0 || f.slots["s1"] != 0 {
		t.Fatalf("committed slots still held as in progress: %v", f.slots)
	}
	// A window sent before the commit: s0 and s1 may look free there; the claim avoids them.
	got, free := f.claim(ch, group, before)
	if !slices.Equal(got, []string{"s2", "s3"}) || !slices.Equal(free, []string{"s2", "s3"}) {
		t.Fatalf("claim from a window older than the commit = %v (free %v), want [s2 s3] (free [s2 s3])", got, free)
	}
	f.release(got)
	other := sched.Choice{NodeID: "n", SlotIDs: []string{"s2", "s3"}, NUMANodes: []int{0}}
	full := sched.Choice{NodeID: "n", SlotIDs: []string{"s0", "s1"}} // no NUMA groups: its own slots only
	if o := f.order([]sched.Choice{full, other}, nil, before); o[0].SlotIDs[0] != "s2" {
		t.Fatalf("order for a window older than the commit = %v, want the choice without committed slots first", o)
	}
	// A window sent after the commit reads the database as it is: nothing is assumed.
	after := commit.Add(time.Millisecond)
	if o := f.order([]sched.Choice{full, other}, nil, after); o[0].SlotIDs[0] != "s0" {
		t.Fatalf("order for a window newer than the commit = %v, want the ranking unchanged", o)
	}
	if got, _ := f.claim(ch, group, after); !slices.Equal(got, []string{"s0", "s1"}) {
		t.Fatalf("claim from a window newer than the commit = %v, want [s0 s1]", got)
	}
	f.release([]string{"s0", "s1"})
	// A rolled-back reservation is forgotten at once.
	if p, _ := f.claim(other, group, before); !slices.Equal(p, []string{"s2", "s3"}) {
		t.Fatalf("claim = %v, want [s2 s3]", p)
	}
	f.release([]string{"s2", "s3"})
	if f.taken("s2", before) || f.taken("s3", before) {
		t.Fatal("rolled-back slots count as taken")
	}
	// Commits older than recentFor are forgotten when the next one is recorded.
	f.committed(nil, []string{"s3"}, commit.Add(recentFor+time.Second))
	if f.taken("s0", before) || len(f.recent) != 1 || len(f.byAge) != 1 {
		t.Fatalf("after recentFor: s0 taken %v, recent %v, queue %v; want only s3 remembered", f.taken("s0", before), f.recent, f.byAge)
	}
}
