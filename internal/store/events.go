package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// EventsChannel is the PostgreSQL NOTIFY channel that wakes event long polls on every
// replica after a commit that appended events from Go code (AppendEvent's callers send it
// with NotifyEvents). Events the triggers append (allocation state, phases, wipes) need no
// notification: each replica's head watcher finds them (api.eventWaiters).
const EventsChannel = "gpuaas_events"

// EventCursor is a position in the event log: the writing transaction's id and the row's id,
// the order readers see (migration 021). The zero cursor is before every event.
type EventCursor struct {
	XID uint64
	ID  int64
}

// String is the cursor as clients hold it: "XID-ID".
func (c EventCursor) String() string {
	if c == (EventCursor{}) {
		return ""
	}
	return strconv.FormatUint(c.XID, 10) + "-" + strconv.FormatInt(c.ID, 10)
}

// ParseEventCursor reads a cursor String gave; "" is the zero cursor.
func ParseEventCursor(s string) (EventCursor, error) {
	if s == "" {
		return EventCursor{}, nil
	}
	x, i, ok := strings.Cut(s, "-")
	xid, err1 := strconv.ParseUint(x, 10, 64)
	id, err2 := strconv.ParseInt(i, 10, 64)
	if !ok || err1 != nil || err2 != nil || id < 0 || strconv.FormatUint(xid, 10) != x || strconv.FormatInt(id, 10) != i {
		return EventCursor{}, fmt.Errorf("%w: cursor %q is not one this API gave (want the next_cursor of a previous answer)", ErrInvalid, s)
	}
	return EventCursor{XID: xid, ID: id}, nil
}

// Less orders cursors as the log does.
func (c EventCursor) Less(o EventCursor) bool {
	return c.XID < o.XID || (c.XID == o.XID && c.ID < o.ID)
}

// NewEvent is an event to append. TenantID "" makes it visible to operators only; NodeID is
// never shown to a tenant; Data is what the event says (a JSON object).
type NewEvent struct {
	Type         string
	TenantID     string
	AllocationID string
	NodeID       string
	Data         any
}

// Event is one event as stored.
type Event struct {
	Cursor       EventCursor
	Type         string
	TenantID     string
	AllocationID string
	NodeID       string
	Data         json.RawMessage
	CreatedAt    time.Time
}

const insertEventSQL = `INSERT INTO events (type, tenant_id, allocation_id, node_id, data) VALUES ($1, $2, $3, $4, $5)`

// AppendEvent appends an event in this transaction: it is readable once the transaction
// commits (and every older writing transaction has ended), and lost with it on rollback.
// Any package that changes state calls it inside its own transaction; after the commit,
// NotifyEvents wakes long polls at once (otherwise the head watchers find it within their
// interval).
func (t *Tx) AppendEvent(ctx context.Context, e NewEvent) error {
	data, err := eventData(e.Data)
	if err != nil {
		return err
	}
	_, err = t.tx.Exec(ctx, insertEventSQL, e.Type, nullIfEmpty(e.TenantID), nullIfEmpty(e.AllocationID), nullIfEmpty(e.NodeID), data)
	return translate(err)
}

func eventData(d any) ([]byte, error) {
	if d == nil {
		return []byte("{}"), nil
	}
	b, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("event data: %w", err)
	}
	return b, nil
}

// NotifyEvents wakes event long polls on every replica (call after the commit).
func (s *Store) NotifyEvents(ctx context.Context) error {
	return s.Notify(ctx, EventsChannel, "")
}

// EventFilter selects events to read.
type EventFilter struct {
	TenantID string // "": every event (operators)
	After    EventCursor
	Since    time.Time // zero: no time bound
	Limit    int       // 1..1000, default 100
}

// eventColumns reads an event of "events e". The transaction id leaves as text (scanEvent
// parses it) under another name: a bare name in ORDER BY means an output column before a
// table's, and an output column "xid" holding the text would sort "10" before "9", so a
// reader whose page ended in 10's events would never see 9's. Queries order by e.xid, e.id.
const eventColumns = `e.xid::text AS xid_text, e.id, e.type, coalesce(e.tenant_id::text, ''), coalesce(e.allocation_id::text, ''),
	coalesce(e.node_id::text, ''), e.data, e.created_at`

// ReadEvents returns the readable events after f.After in log order, and the cursor to resume
// from (f.After when there were none).
func (s *Store) ReadEvents(ctx context.Context, f EventFilter) ([]Event, EventCursor, error) {
	return readEvents(ctx, s.pool, f)
}

// readEvents reads past the cursor up to the horizon: rows of transactions older than the
// oldest one in flight, judged in the statement's own snapshot (pg_current_snapshot is the
// active snapshot, the one the rows are read in).
func readEvents(ctx context.Context, q querier, f EventFilter) ([]Event, EventCursor, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	var since any
	if !f.Since.IsZero() {
		since = f.Since
	}
	where := `(e.xid, e.id) > ($1::text::xid8, $2::bigint) AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
		AND ($3::timestamptz IS NULL OR e.created_at >= $3::timestamptz)`
	args := []any{strconv.FormatUint(f.After.XID, 10), f.After.ID, since, f.Limit}
	if f.TenantID != "" {
		where += ` AND e.tenant_id = $5::uuid`
		args = append(args, uuidArg(f.TenantID))
	}
	evs, err := queryAll(ctx, q, scanEvent, `SELECT `+eventColumns+` FROM events e WHERE `+where+` ORDER BY e.xid, e.id LIMIT $4`, args...)
	if err != nil {
		return nil, f.After, err
	}
	// Checked after the read: a prune that committed before the read's snapshot has moved
	// the mark by now, so a cursor it overtook is never answered with a silent gap.
	if f.After != (EventCursor{}) {
		pruned, err := prunedThrough(ctx, q)
		if err != nil {
			return nil, f.After, err
		}
		if f.After.Less(pruned) {
			return nil, f.After, &CursorExpiredError{Cursor: f.After, PrunedThrough: pruned}
		}
	}
	next := f.After
	if len(evs) > 0 {
		next = evs[len(evs)-1].Cursor
	}
	return evs, next, nil
}

func scanEvent(r pgx.Row, e *Event) error {
	var xid string
	if err := r.Scan(&xid, &e.Cursor.ID, &e.Type, &e.TenantID, &e.AllocationID, &e.NodeID, rawJSON(&e.Data), &e.CreatedAt); err != nil {
		return err
	}
	x, err := strconv.ParseUint(xid, 10, 64)
	if err != nil {
		return fmt.Errorf("event xid %q: %w", xid, err)
	}
	e.Cursor.XID = x
	return nil
}

// EventHead is the cursor of the newest readable event (zero when there is none): the
// head watchers compare it to wake waiting long polls.
func (s *Store) EventHead(ctx context.Context) (EventCursor, error) {
	var xid string
	var c EventCursor
	err := s.pool.QueryRow(ctx, `SELECT e.xid::text AS xid_text, e.id FROM events e WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
		ORDER BY e.xid DESC, e.id DESC LIMIT 1`).Scan(&xid, &c.ID)
	if err == pgx.ErrNoRows {
		return EventCursor{}, nil
	}
	if err != nil {
		return EventCursor{}, translate(err)
	}
	c.XID, err = strconv.ParseUint(xid, 10, 64)
	return c, err
}

// EventClockBehind reports whether the log holds events of transaction ids this cluster has
// not reached: the database was restored from a logical dump into another cluster, which
// numbers transactions afresh. New events would then sort before cursors clients and webhooks
// already hold, and they would never see them.
func (s *Store) EventClockBehind(ctx context.Context) (bool, error) {
	var behind bool
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT xid FROM events ORDER BY xid DESC LIMIT 1) >= pg_snapshot_xmax(pg_current_snapshot()), false)`).Scan(&behind)
	return behind, translate(err)
}

// CursorExpiredError: events after the cursor were removed by retention before the reader
// got to them (the reader starts again without a cursor, or with since=).
type CursorExpiredError struct {
	Cursor, PrunedThrough EventCursor
}

func (e *CursorExpiredError) Error() string {
	return fmt.Sprintf("events after cursor %s were removed by the event log's retention (pruned through %s): read again without a cursor, or with since=", e.Cursor, e.PrunedThrough)
}

// prunedThrough is the cursor of the last event retention removed (zero: none).
func prunedThrough(ctx context.Context, q querier) (EventCursor, error) {
	var x string
	var c EventCursor
	err := q.QueryRow(ctx, `SELECT xid::text, id FROM events_pruned`).Scan(&x, &c.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return EventCursor{}, nil
	}
	if err != nil {
		return EventCursor{}, translate(err)
	}
	c.XID, err = strconv.ParseUint(x, 10, 64)
	return c, err
}

// PruneEvents removes up to batch of the oldest events older than keep (at least a day),
// with their finished webhook deliveries, stopping at the first event still owed to a
// webhook (migration 030); it returns how many it removed (0 also when another replica is
// pruning at the same moment).
func (s *Store) PruneEvents(ctx context.Context, keep time.Duration, batch int) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT prune_events(make_interval(secs => $1), $2)`, keep.Seconds(), batch).Scan(&n)
	return n, translate(err)
}
