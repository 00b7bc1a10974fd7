package gctune

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{5 * mib, 48 * mib, 960},   // small heap: next collection at live + 48 MiB
		{48 * mib, 48 * mib, 100},  // from here on Go's own 2 x live
		{200 * mib, 48 * mib, 100}, // a large heap is never given more than Go gives it
		{0, 48 * mib, MaxPercent},  // an empty heap is bounded
		{1, 48 * mib, MaxPercent},
	} {
		if got := Percent(c.live, c.headroom); got != c.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", c.live, c.headroom, got, c.want)
		}
	}
}

func gogc(t *testing.T) int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// After a collection the tuner sets the percent for the live heap it finds, and Stop gives
// Go's default back.
func TestTunerSetsThePercentAfterEachCollection(t *testing.T) {
	t.Setenv("GOGC", "")
	const headroom = 1 << 30 // far above this test's live heap: the tuner must raise the percent
	got := make(chan int, 16)
	tu := Start(headroom, func(p int) {
		select {
		case got <- p:
		default:
		}
	})
	if tu == nil {
		t.Fatal("Start returned nil with a headroom and no GOGC")
	}
	defer tu.Stop()
	for round := 0; round < 2; round++ { // re-armed after each collection
		runtime.GC()
		select {
		case p := <-got:
			if p <= 100 {
				t.Fatalf("round %d: percent %d for a 1 GiB headroom over a small heap, want > 100", round, p)
			}
			if g := gogc(t); g != p {
				t.Fatalf("round %d: runtime GC percent %d, tuner reported %d", round, g, p)
			}
		case <-time.After(30 * time.Second): // a guard against a hang, not a timing assertion
			t.Fatalf("round %d: no tuning after runtime.GC", round)
		}
	}
	tu.Stop()
	if g := gogc(t); g != 100 {
		t.Fatalf("after Stop the GC percent is %d, want 100", g)
	}
}

func TestTunerOffWithoutHeadroomOrWithGOGC(t *testing.T) {
	if Start(0, nil) != nil {
		t.Error("Start(0) tunes; 0 means off")
	}
	t.Setenv("GOGC", "200")
	if Start(1<<26, nil) != nil {
		t.Error("Start tunes although GOGC is set: the operator's setting must win")
	}
	var nilTuner *Tuner
	nilTuner.Stop() // safe
}
