package demand_test

import (
	"context"
	"errors"
	"os"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/demand"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/sched"
	"github.com/gpuaas/gpuaas/internal/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, store.MigrateForTest)) }

const sku = "h200-sxm-slice" // seeded: 1, 2, 4 and 8 GPUs

// replica is one controller's store and learner on the test's database, on a clock the test
// moves.
type replica struct {
	st *store.Store
	l  *demand.Learner
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

func newReplica(t *testing.T, url string, c *clock) replica {
	t.Helper()
	st, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return replica{st: st, l: demand.New(st, demand.Config{Now: c.Now})}
}

func record(l *demand.Learner, region string, gpus, n int) {
	for range n {
		l.Record(sku, region, gpus)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestTwoReplicasSeeTheSameMix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	c := &clock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	a, b := newReplica(t, url, c), newReplica(t, url, c)
	// Each replica alone saw a different side of the demand: 1-GPU requests on a, 8-GPU on b.
	record(a.l, "", 1, 60)
	record(b.l, "", 8, 40)
	must(t, a.l.Flush(ctx))
	must(t, b.l.Flush(ctx))
	must(t, a.l.Refresh(ctx))
	must(t, b.l.Refresh(ctx))
	ma, mb := a.l.Mix(sku, ""), b.l.Mix(sku, "")
	want := []sched.MixEntry{{GPUs: 1, Weight: 6000}, {GPUs: 8, Weight: 4000}}
	if ma.Source != demand.SourceLearned || !reflect.DeepEqual(ma.Entries, want) || ma.Requests != 100 {
		t.Fatalf("replica a's mix = %+v, want learned %v from 100 requests", ma, want)
	}
	if !reflect.DeepEqual(ma, mb) {
		t.Fatalf("the replicas disagree: a %+v, b %+v", ma, mb)
	}
}

func TestRestartKeepsTheMix(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	c := &clock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	first := newReplica(t, url, c)
	record(first.l, "eu-1", 2, 30)
	record(first.l, "eu-1", 4, 70)
	// A clean shutdown flushes what is still counted in memory: no explicit Flush here.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { first.l.Run(ctx); close(done) }()
	cancel()
	<-done
	first.st.Close()

	again := newReplica(t, url, c)
	must(t, again.l.Refresh(context.Background()))
	m := again.l.Mix(sku, "eu-1")
	want := []sched.MixEntry{{GPUs: 2, Weight: 3000}, {GPUs: 4, Weight: 7000}}
	if m.Source != demand.SourceLearned || m.Scope != demand.ScopeRegion || !reflect.DeepEqual(m.Entries, want) {
		t.Fatalf("after a restart the mix is %+v, want learned in the region %v", m, want)
	}
}

func TestOldBurstFadesByTheHalfLife(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &clock{now: t0}
	a, b := newReplica(t, url, c), newReplica(t, url, c)
	// A burst of 100 whole hosts, then one half-life later 100 single GPUs: the burst counts
	// half, so the mix is 50 : 100.
	record(a.l, "", 8, 100)
	must(t, a.l.Flush(ctx))
	c.Set(t0.Add(demand.HalfLife))
	record(b.l, "", 1, 100)
	must(t, b.l.Flush(ctx))
	must(t, a.l.Refresh(ctx))
	m := a.l.Mix(sku, "")
	want := []sched.MixEntry{{GPUs: 1, Weight: 6667}, {GPUs: 8, Weight: 3333}}
	if !reflect.DeepEqual(m.Entries, want) || m.Requests < 149.99 || m.Requests > 150.01 {
		t.Fatalf("one half-life after the burst: %+v, want %v from 150 decayed requests", m, want)
	}
	// Another half-life with no requests halves every count (75: still enough history), and
	// shares do not change.
	c.Set(t0.Add(2 * demand.HalfLife))
	must(t, a.l.Refresh(ctx))
	if m := a.l.Mix(sku, ""); m.Requests < 74.99 || m.Requests > 75.01 || !reflect.DeepEqual(m.Entries, want) {
		t.Fatalf("two half-lives after the burst: %+v, want the same shares from 75 requests", m)
	}
	// Five half-lives on, 150 / 32 < MinRequests: back to the default.
	c.Set(t0.Add(6 * demand.HalfLife))
	must(t, a.l.Refresh(ctx))
	if m := a.l.Mix(sku, ""); m.Source != demand.SourceDefault || m.Requests > 5 {
		t.Fatalf("after the history faded: %+v, want the default", m)
	}
}

func TestFlushesCombineInAnyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var got [2]float64
	for i, late := range []bool{false, true} {
		url := pgtest.NewDatabase(t)
		c := &clock{now: t0}
		a, b := newReplica(t, url, c), newReplica(t, url, c)
		// a flushes at t0, b at t0 + one half-life; with late, b's flush reaches the database
		// first (a replica whose flush was slow, or whose clock is behind).
		record(a.l, "", 4, 80)
		record(b.l, "", 4, 80)
		flush := func(r replica, at time.Time) {
			c.Set(at)
			must(t, r.l.Flush(ctx))
		}
		if late {
			flush(b, t0.Add(demand.HalfLife))
			flush(a, t0)
		} else {
			flush(a, t0)
			flush(b, t0.Add(demand.HalfLife))
		}
		c.Set(t0.Add(demand.HalfLife))
		must(t, a.l.Refresh(ctx))
		got[i] = a.l.Mix(sku, "").Requests
	}
	if got[0] < 119.99 || got[0] > 120.01 || got[0]-got[1] > 1e-6 || got[1]-got[0] > 1e-6 {
		t.Fatalf("80 requests a half-life old plus 80 now: %v in order, %v out of order; want 120 both", got[0], got[1])
	}
}

func TestPinnedBeatsLearned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	c := &clock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	r := newReplica(t, url, c)
	record(r.l, "", 1, 500)
	must(t, r.l.Flush(ctx))
	audit := store.AuditRecord{Actor: "ops", ActorRole: "admin", Action: "sku.demand_mix.pin", TargetKind: "sku", TargetID: sku}
	must(t, r.st.PinDemandMix(ctx, sku, map[int]int{4: 1, 8: 3}, "ops", audit))
	must(t, r.l.Refresh(ctx))
	m := r.l.Mix(sku, "")
	if m.Source != demand.SourcePinned || m.PinnedBy != "ops" || !reflect.DeepEqual(m.Entries, []sched.MixEntry{{GPUs: 4, Weight: 1}, {GPUs: 8, Weight: 3}}) {
		t.Fatalf("with a pin: %+v, want the pin", m)
	}
	// Unpinned, the learned mix is back.
	must(t, r.st.PinDemandMix(ctx, sku, nil, "ops", audit))
	must(t, r.l.Refresh(ctx))
	if m := r.l.Mix(sku, ""); m.Source != demand.SourceLearned {
		t.Fatalf("after unpinning: %+v, want learned", m)
	}
	// The database refuses a count the SKU does not sell, whoever writes it.
	err := r.st.PinDemandMix(ctx, sku, map[int]int{3: 1}, "ops", audit)
	var dbe *store.DBError
	if !errors.As(err, &dbe) || dbe.Constraint != "demand_mix_pin_count" {
		t.Fatalf("pinning 3 GPUs of %s: %v, want the demand_mix_pin_count refusal", sku, err)
	}
}

func TestDefaultUntilEnoughHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	c := &clock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	r := newReplica(t, url, c)
	// 49 requests in us-1: the default everywhere.
	record(r.l, "us-1", 8, demand.MinRequests-1)
	must(t, r.l.Flush(ctx))
	must(t, r.l.Refresh(ctx))
	if m := r.l.Mix(sku, "us-1"); m.Source != demand.SourceDefault || m.Entries != nil || m.Requests != demand.MinRequests-1 {
		t.Fatalf("below MinRequests: %+v, want the default", m)
	}
	// The 50th: learned, in its region and for the SKU as a whole; another region with no
	// history of its own takes the SKU's.
	record(r.l, "us-1", 1, 1)
	must(t, r.l.Flush(ctx))
	must(t, r.l.Refresh(ctx))
	if m := r.l.Mix(sku, "us-1"); m.Source != demand.SourceLearned || m.Scope != demand.ScopeRegion {
		t.Fatalf("at MinRequests: %+v, want learned in the region", m)
	}
	if m := r.l.Mix(sku, "eu-1"); m.Source != demand.SourceLearned || m.Scope != demand.ScopeSKU {
		t.Fatalf("a region without history: %+v, want the SKU's learned mix", m)
	}
	if m := r.l.Mix("other-sku", ""); m.Source != demand.SourceDefault {
		t.Fatalf("a SKU never asked for: %+v, want the default", m)
	}
}
