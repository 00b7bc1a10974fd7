package store

import (
	"errors"
	"testing"
)

// A server behind the highest timeline seen for its cluster is refused; the same or a later
// one is admitted, and clusters (system identifiers) are tracked apart.
func TestAdmitTimeline(t *testing.T) {
	const sys, other = "test-system-1", "test-system-2"
	for _, step := range []struct {
		system   string
		timeline uint64
		refused  bool
	}{
		{sys, 1, false}, {sys, 1, false}, {sys, 2, false}, // the primary, then the promoted standby
		{sys, 1, true},    // the old primary back on its own
		{other, 1, false}, // another cluster entirely
		{sys, 3, false}, {sys, 2, true},
		{sys, 0, false}, // a standby writes no WAL of its own: nothing to compare
	} {
		err := admitTimeline(step.system, step.timeline)
		var stale *staleTimelineError
		if got := errors.As(err, &stale); got != step.refused {
			t.Fatalf("admit %s timeline %d: %v; want refused=%v", step.system, step.timeline, err, step.refused)
		}
	}
}
