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

// A slice create is four round trips to PostgreSQL and a release before provisioning three:
// each transaction's BEGIN rides with its first batch, and the create's first placement
// window with the SKU lookup. At 1 client a round trip costs about 0.1 ms of wall time on the
// bench machine (docs/performance.md), so this guards the latency the API adds over raw SQL.
func TestCreateAndReleaseRoundTrips(t *testing.T) {
	log := &pgtest.Trips{Words: 2}
	b := setupStore(t, alloc.Config{}, store.Options{MaxConns: 4, Tracer: log})
	b.addNode("n1", 1)
	b.addNode("n2", 2)
	if _, err := b.st.RefreshCapacity(b.ctx); err != nil { // the controller's capacity loop
		t.Fatal(err)
	}
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
	if len(create) != 4 || !strings.HasPrefix(create[0], "BEGIN | SELECT SKU,") || !strings.Contains(create[0], "SET LOCAL") ||
		create[len(create)-1] != "COMMIT" {
		t.Errorf("create: %d round trips, want 4 (BEGIN with the SKU lookup and first window; slot lock; insert; COMMIT):%s", len(create), show(create))
	}
	if len(release) != 3 || !strings.HasPrefix(release[0], "BEGIN |") || release[len(release)-1] != "COMMIT" {
		t.Errorf("release: %d round trips, want 3 (BEGIN with the lock read; writes; COMMIT):%s", len(release), show(release))
	}
	b.invariants()
}
