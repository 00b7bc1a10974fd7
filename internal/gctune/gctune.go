// Package gctune gives a process with a small live heap a fixed headroom before its next
// garbage collection. Go's default (GOGC=100) collects when the heap reaches twice the live
// heap, so a controller with a few MiB of live data collects many times a second under load:
// 15-20% of its CPU at 16 create+release clients (docs/performance.md). With a headroom H the
// next collection comes at max(2 x live, live + H): a small heap collects far less often and
// a large one exactly as Go would, so the process never holds more than H beyond Go's own
// bound. Go offers no floor of this kind (GOMEMLIMIT is a ceiling), so after every collection
// the tuner sets the GC percent that puts the next one there.
package gctune

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// MaxPercent bounds the GC percent the tuner sets (a nearly empty heap would ask for more).
const MaxPercent = 10000

// Percent is the GC percent that puts the next collection at live+headroom bytes, never
// below Go's default 100 (twice the live heap) and never above MaxPercent.
func Percent(live, headroom uint64) int {
	if live == 0 {
		live = 1
	}
	p := headroom * 100 / live
	switch {
	case p < 100:
		return 100
	case p > MaxPercent:
		return MaxPercent
	}
	return int(p)
}

// Tuner adjusts the GC percent after every collection; Stop ends it.
type Tuner struct {
	headroom uint64
	onTune   func(percent int)
	mu       sync.Mutex
	stopped  bool
	last     int
	sample   []metrics.Sample
}

// sentinel is garbage the moment it is armed: its cleanup runs after the next collection.
type sentinel struct{ _ [16]byte }

// Start tunes the GC for headroom bytes (see the package comment). It does nothing and
// returns nil when headroom is 0 or the GOGC environment variable is set (the operator's
// explicit choice wins). onTune, if set, is called with each percent the tuner sets (tests).
func Start(headroom uint64, onTune func(percent int)) *Tuner {
	if headroom == 0 || os.Getenv("GOGC") != "" {
		return nil
	}
	t := &Tuner{headroom: headroom, onTune: onTune, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	t.arm()
	return t
}

func (t *Tuner) arm() {
	s := &sentinel{}
	runtime.AddCleanup(s, func(t *Tuner) { t.tune() }, t)
}

// tune runs on the runtime's cleanup goroutine after a collection.
func (t *Tuner) tune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	// Re-arm before reporting: whoever learns of this tuning (a test waiting on onTune) may
	// collect again at once, and a sentinel allocated after that collection would wait for
	// the one after it.
	t.arm()
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		p := Percent(t.sample[0].Value.Uint64(), t.headroom)
		if p != t.last {
			debug.SetGCPercent(p)
			t.last = p
		}
		if t.onTune != nil {
			t.onTune(p)
		}
	}
}

// Stop ends the tuning and restores Go's default GC percent. Safe on a nil Tuner.
func (t *Tuner) Stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.stopped = true
		debug.SetGCPercent(100)
	}
}
