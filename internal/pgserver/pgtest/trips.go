package pgtest

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Trips is a pgx.QueryTracer that records the round trips a pool's connections make: one
// entry per lone statement, and one per batch holding its statements joined with " | ".
// Each statement is cut to its first Words words, upper-cased (0: whole, lower-cased).
type Trips struct {
	Words   int
	mu      sync.Mutex
	inBatch bool
	trips   []string
}

func (l *Trips) text(sql string) string {
	if l.Words == 0 {
		return strings.ToLower(sql)
	}
	f := strings.Fields(sql)
	return strings.ToUpper(strings.Join(f[:min(l.Words, len(f))], " "))
}

// TraceQueryStart records a lone statement (a batch's are recorded with the batch).
func (l *Trips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.inBatch {
		l.trips = append(l.trips, l.text(d.SQL))
	}
	return ctx
}

// TraceQueryEnd does nothing.
func (l *Trips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart records a batch as one round trip.
func (l *Trips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inBatch = true
	qs := make([]string, 0, len(d.Batch.QueuedQueries))
	for _, q := range d.Batch.QueuedQueries {
		qs = append(qs, l.text(q.SQL))
	}
	l.trips = append(l.trips, strings.Join(qs, " | "))
	return ctx
}

// TraceBatchQuery does nothing.
func (l *Trips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd ends the batch.
func (l *Trips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inBatch = false
}

// Take returns the round trips recorded since the last Take.
func (l *Trips) Take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.trips
	l.trips = nil
	return out
}
