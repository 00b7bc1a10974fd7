package demand

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuaas/gpuaas/internal/sched"
	"github.com/gpuaas/gpuaas/internal/store"
)

const (
	// FlushEvery is how often a replica adds its counted requests to the database: a
	// replica that dies loses at most this much of its history, a negligible share of six
	// hours'.
	FlushEvery = 5 * time.Second
	// RefreshEvery is how often a replica reads the shared counts and pins back: a pin takes
	// effect on every replica within it.
	RefreshEvery = 15 * time.Second
)

// Sources of a mix in use.
const (
	SourceLearned = "learned" // from the requests seen
	SourcePinned  = "pinned"  // an admin's pin
	SourceDefault = "default" // sched.DefaultMix: not enough history yet
)

// Mix is the demand mix placement uses for one SKU and region, and where it came from.
type Mix struct {
	// Entries is the mix (weights relative), in GPU count order; nil for the default.
	Entries []sched.MixEntry
	Source  string
	// Requests is the decayed requests the learned mix comes from; for the default, the
	// history gathered so far (less than MinRequests).
	Requests float64
	Scope    string // learned: ScopeRegion or ScopeSKU
	PinnedBy string
	PinnedAt time.Time
}

// Config tunes a Learner; zero values take the package's constants.
type Config struct {
	HalfLife     time.Duration
	MinRequests  float64
	FlushEvery   time.Duration
	RefreshEvery time.Duration
	Now          func() time.Time
	Log          *slog.Logger
}

// Learner counts this replica's requests, flushes them and serves the shared mix from a
// cached read. A nil *Learner records nothing and serves the default mix.
type Learner struct {
	st  *store.Store
	cfg Config

	mu      sync.Mutex
	pending map[Key]float64

	snap atomic.Pointer[snapshot]
}

// snapshot is one read of the shared counts (decayed to when it was read) and the pins.
type snapshot struct {
	counts map[Key]float64
	pins   map[string]Mix
}

// New returns a Learner on st; Run (or Flush and Refresh) moves its counts.
func New(st *store.Store, cfg Config) *Learner {
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = HalfLife
	}
	if cfg.MinRequests <= 0 {
		cfg.MinRequests = MinRequests
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = FlushEvery
	}
	if cfg.RefreshEvery <= 0 {
		cfg.RefreshEvery = RefreshEvery
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Learner{st: st, cfg: cfg, pending: map[Key]float64{}}
}

// Record counts one request of gpus GPUs of sku in region (created or refused). Memory only:
// it never touches the database.
func (l *Learner) Record(sku, region string, gpus int) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.pending[Key{SKU: sku, Region: region, GPUs: gpus}]++
	l.mu.Unlock()
}

// Flush adds the requests counted since the last flush to the database, as of now. On
// failure they stay counted for the next flush.
func (l *Learner) Flush(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	pending := l.pending
	l.pending = map[Key]float64{}
	l.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	now := l.cfg.Now()
	rows := make([]store.DemandCount, 0, len(pending))
	for k, n := range pending {
		rows = append(rows, store.DemandCount{SKU: k.SKU, Region: k.Region, GPUs: k.GPUs, Requests: n, AsOf: now})
	}
	if err := l.st.AddDemand(ctx, rows, l.cfg.HalfLife); err != nil {
		l.mu.Lock()
		for k, n := range pending {
			l.pending[k] += n
		}
		l.mu.Unlock()
		return err
	}
	return nil
}

// Refresh reads every replica's counts and the pins into the cache Mix serves from.
func (l *Learner) Refresh(ctx context.Context) error {
	if l == nil {
		return nil
	}
	rows, err := l.st.DemandCounts(ctx)
	if err != nil {
		return err
	}
	pins, err := l.st.DemandPins(ctx)
	if err != nil {
		return err
	}
	now := l.cfg.Now()
	s := &snapshot{counts: make(map[Key]float64, len(rows)), pins: map[string]Mix{}}
	for _, r := range rows {
		s.counts[Key{SKU: r.SKU, Region: r.Region, GPUs: r.GPUs}] += r.Requests * Decay(now.Sub(r.AsOf), l.cfg.HalfLife)
	}
	for _, p := range pins {
		m := s.pins[p.SKU]
		m.Source, m.PinnedBy = SourcePinned, p.PinnedBy
		if p.PinnedAt.After(m.PinnedAt) {
			m.PinnedAt = p.PinnedAt
		}
		m.Entries = append(m.Entries, sched.MixEntry{GPUs: p.GPUs, Weight: p.Weight})
		s.pins[p.SKU] = m
	}
	l.snap.Store(s)
	return nil
}

// Mix is the mix placement uses for sku in region, as of the last Refresh: the pin, else the
// learned mix once there is enough history, else the default.
func (l *Learner) Mix(sku, region string) Mix {
	if l == nil {
		return Mix{Source: SourceDefault}
	}
	s := l.snap.Load()
	if s == nil {
		return Mix{Source: SourceDefault}
	}
	if p, ok := s.pins[sku]; ok {
		return p
	}
	entries, n, scope, ok := MixOf(s.counts, sku, region, l.cfg.MinRequests)
	if !ok {
		return Mix{Source: SourceDefault, Requests: n}
	}
	return Mix{Entries: entries, Source: SourceLearned, Requests: n, Scope: scope}
}

// Run flushes and refreshes until ctx ends, then flushes once more (within a few seconds) so
// a replica shut down cleanly loses none of its counts.
func (l *Learner) Run(ctx context.Context) {
	if err := l.Refresh(ctx); err != nil && ctx.Err() == nil {
		l.cfg.Log.Warn("demand mix: refresh failed", "err", err)
	}
	flush := time.NewTicker(l.cfg.FlushEvery)
	defer flush.Stop()
	refresh := time.NewTicker(l.cfg.RefreshEvery)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := l.Flush(fctx); err != nil {
				l.cfg.Log.Warn("demand mix: final flush failed", "err", err)
			}
			cancel()
			return
		case <-flush.C:
			if err := l.Flush(ctx); err != nil && ctx.Err() == nil {
				l.cfg.Log.Warn("demand mix: flush failed (kept for the next)", "err", err)
			}
		case <-refresh.C:
			if err := l.Refresh(ctx); err != nil && ctx.Err() == nil {
				l.cfg.Log.Warn("demand mix: refresh failed", "err", err)
			}
		}
	}
}
