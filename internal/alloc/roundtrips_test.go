package alloc_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
)

// A slice create is three round trips to PostgreSQL and a release before provisioning two:
// each transaction's BEGIN rides with its first batch, its COMMIT with its last, and the
// create's first placement window with the SKU lookup. At 1 client a round trip costs about 0.1 ms of wall time on the
// bench machine (docs/performance.md), so this guards the latency the API adds over raw SQL.
// Neither reads back what it has just written: the answers come from what the writes returned.
func TestCreateAndReleaseRoundTrips(t *testing.T) {
	log := &pgtest.Trips{Words: 2}
	b := setupStore(t, alloc.Config{}, store.Options{MaxConns: 4, Tracer: log})
	b.addNode("n1", 1)
	b.addNode("n2", 2)
	b.refreshCapacity()
	log.Take()
	a, _, err := b.svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 4}, "")
	if err != nil {
		t.Fatal(err)
	}
	create := log.Take()
	if _, err := b.svc.Release(b.ctx, b.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	release := log.Take()
	show := func(trips []string) string {
		var s strings.Builder
		for i, tr := range trips {
			fmt.Fprintf(&s, "\n  %d: %s", i+1, tr)
		}
		return s.String()
	}
	if len(create) != 3 || !strings.HasPrefix(create[0], "BEGIN | SELECT SKU,") || !strings.Contains(create[0], "SET LOCAL") ||
		!strings.Contains(create[2], "INSERT INTO") || !strings.HasSuffix(create[2], "| COMMIT") {
		t.Errorf("create: %d round trips, want 3 (BEGIN with the SKU lookup and first window; slot lock; insert with the COMMIT):%s", len(create), show(create))
	}
	if len(release) != 2 || !strings.HasPrefix(release[0], "BEGIN |") || !strings.HasSuffix(release[1], "| COMMIT") {
		t.Errorf("release: %d round trips, want 2 (BEGIN with the lock read; writes with the COMMIT):%s", len(release), show(release))
	}
	// The answers are built from what the writes returned: the create's insert trip and the
	// release's write trip read nothing back; the release's lock trip reads the allocation,
	// its claims and its tasks once each (the tasks with the cancel of its queued ones).
	reads := func(trip string) (n int) {
		for _, st := range strings.Split(trip, " | ") {
			if strings.HasPrefix(st, "SELECT") {
				n++
			}
		}
		return n
	}
	if len(create) == 3 && reads(create[2]) != 0 {
		t.Errorf("create: the insert's round trip reads %d statements back, want none: %s", reads(create[2]), create[2])
	}
	if len(release) == 2 && (reads(release[0]) != 2 || reads(release[1]) != 0) {
		t.Errorf("release: %d reads with the lock (want 2: the allocation, its claims; the tasks ride with the cancel), %d with the writes (want none):%s",
			reads(release[0]), reads(release[1]), show(release))
	}
	// Both committed: another connection reads the released allocation.
	if got, err := b.svc.Get(b.ctx, b.tenant, a.ID); err != nil || got.Status != "released" {
		t.Fatalf("after release: %v, %v", got.Status, err)
	}
	b.invariants()
}
