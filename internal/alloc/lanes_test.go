package alloc

import (
	"testing"

	"github.com/gpuaas/gpuaas/internal/sched"
)

// A create alone is lane 0 and reads the first empty nodes, as a window always did for one;
// concurrent creates take the lowest free lanes, a lane given back is taken again first, and
// the lanes' empty nodes do not overlap within a window.
func TestLanesGiveConcurrentCreatesTheirOwnEmptyNodes(t *testing.T) {
	var l lanes
	if n := l.take(); n != 0 || emptySkip(n) != 0 {
		t.Fatalf("a create alone: lane %d skipping %d empty nodes, want lane 0 skipping none", n, emptySkip(n))
	}
	if b, c := l.take(), l.take(); b != 1 || c != 2 {
		t.Fatalf("two more creates: lanes %d and %d, want 1 and 2", b, c)
	}
	l.give(1)
	if n := l.take(); n != 1 {
		t.Fatalf("after lane 1 ended: took lane %d, want 1 again", n)
	}
	l.give(0)
	l.give(1)
	l.give(2)
	if n := l.take(); n != 0 {
		t.Fatalf("all ended: took lane %d, want 0", n)
	}
	seen := map[int]int{}
	perWindow := sched.WindowNodes / sched.WindowEmptyTies
	for n := range perWindow {
		for k := range sched.WindowEmptyTies {
			pos := emptySkip(n) + k
			if other, dup := seen[pos]; dup || pos >= sched.WindowNodes {
				t.Fatalf("lane %d reads empty node %d of the window (lane %d's too, or past the window's %d)", n, pos, other, sched.WindowNodes)
			}
			seen[pos] = n
		}
	}
	if emptySkip(perWindow) != 0 {
		t.Fatalf("lane %d skips %d, want 0 (lanes past a window's width share from the start)", perWindow, emptySkip(perWindow))
	}
}
