package controller

import (
	"context"
	"log/slog"
	"time"

	"github.com/gpuaas/gpuaas/internal/store"
)

// pruneEvery is how often a replica removes events past the retention; pruneBatch bounds
// one transaction's work so a large backlog never holds locks for long.
const (
	pruneEvery = 10 * time.Minute
	pruneBatch = 5000
)

// pruneEvents removes events older than keep, at start and then every pruneEvery, in
// batches until the backlog is gone (keep 0: never). Every replica runs it; the database
// lets one prune at a time (store.PruneEvents).
func pruneEvents(ctx context.Context, st *store.Store, keep time.Duration, log *slog.Logger) {
	if keep <= 0 {
		return
	}
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		var total int64
		for ctx.Err() == nil {
			n, err := st.PruneEvents(ctx, keep, pruneBatch)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("event retention", "err", err)
				}
				break
			}
			total += n
			if n < pruneBatch {
				break
			}
		}
		if total > 0 {
			log.Info("event retention removed old events", "events", total, "older_than", keep.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
