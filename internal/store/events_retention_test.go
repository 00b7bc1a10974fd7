package store_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/store"
)

// Retention removes the oldest events, a prefix of the log in reader order, with their
// finished webhook deliveries; it stops at the first event a webhook still owes (not yet
// fanned out, or a delivery pending) and never removes a young one. A reader whose cursor
// lies before what was removed is told so, never handed a silent gap; plain SQL still
// cannot delete events.
func TestEventRetentionRemovesAPrefixAndExpiresOvertakenCursors(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var t1, t2 string
	if err := conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ('ret-one') RETURNING id::text`).Scan(&t1); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ('ret-two') RETURNING id::text`).Scan(&t2); err != nil {
		t.Fatal(err)
	}
	// Each event in its own transaction, so the log's order is the order written here.
	old := time.Now().Add(-40 * 24 * time.Hour)
	for _, e := range []struct {
		typ, tenant string
		at          time.Time
	}{{"test.e1", t1, old}, {"test.e2", t2, old}, {"test.e3", t1, old}, {"test.e4", t2, old}, {"test.e5", t1, old},
		{"test.e6", t1, time.Now()}} {
		exec(`INSERT INTO events (type, tenant_id, created_at) VALUES ($1, $2::uuid, $3)`, e.typ, e.tenant, e.at)
	}
	cursor := func(typ string) store.EventCursor {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, `SELECT xid::text || '-' || id FROM events WHERE type = $1`, typ).Scan(&s); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		c, err := store.ParseEventCursor(s)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2, c3, c4, c5 := cursor("test.e1"), cursor("test.e2"), cursor("test.e3"), cursor("test.e4"), cursor("test.e5")
	// Tenant two's webhook was fanned out through e2 (delivered, one attempt); e4 is still owed.
	var w2, d2 string
	if err := conn.QueryRow(ctx, `INSERT INTO webhooks (tenant_id, url, secret, cursor_xid, cursor_id)
		VALUES ($1::uuid, 'https://hooks.example/two', repeat('s', 32), $2::text::xid8, $3) RETURNING id::text`,
		t2, strconv.FormatUint(c2.XID, 10), c2.ID).Scan(&w2); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO webhook_deliveries (webhook_id, event_id, status, attempts, finished_at)
		VALUES ($1::uuid, $2, 'delivered', 1, now()) RETURNING id::text`, w2, c2.ID).Scan(&d2); err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO webhook_attempts (delivery_id, attempt, status_code) VALUES ($1::uuid, 1, 204)`, d2)

	// Retention, like readers, sees only events of transactions older than the oldest one in
	// flight in the cluster (other tests' included): wait until all six are readable.
	for deadline := time.Now().Add(time.Minute); ; {
		evs, _, err := st.ReadEvents(ctx, store.EventFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 6 events readable after a minute", len(evs))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := st.PruneEvents(ctx, time.Hour, 100); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("retention of an hour: %v, want refused", err)
	}
	n, err := st.PruneEvents(ctx, 30*24*time.Hour, 100)
	if err != nil || n != 3 {
		t.Fatalf("first prune removed %d (%v), want 3: e1-e3, stopping at e4, which tenant two's webhook still owes", n, err)
	}
	var deliveries, attempts int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhook_deliveries), (SELECT count(*) FROM webhook_attempts)`).Scan(&deliveries, &attempts); err != nil {
		t.Fatal(err)
	}
	if deliveries != 0 || attempts != 0 {
		t.Fatalf("after the prune: %d deliveries, %d attempts of removed events left", deliveries, attempts)
	}
	var expired *store.CursorExpiredError
	if _, _, err := st.ReadEvents(ctx, store.EventFilter{After: c1}); !errors.As(err, &expired) || expired.PrunedThrough != c3 {
		t.Fatalf("read after a removed event's cursor: %v, want cursor expired through %s", err, c3)
	}
	evs, _, err := st.ReadEvents(ctx, store.EventFilter{After: c3})
	if err != nil || len(evs) != 3 || evs[0].Cursor != c4 {
		t.Fatalf("read after the last removed event: %d events, %v; want e4, e5, e6", len(evs), err)
	}
	if evs, _, err := st.ReadEvents(ctx, store.EventFilter{}); err != nil || len(evs) != 3 {
		t.Fatalf("read from the start: %d events, %v", len(evs), err)
	}

	// Once the webhook has e4, the prune goes on and stops at e5, whose delivery is pending.
	var w1 string
	if err := conn.QueryRow(ctx, `INSERT INTO webhooks (tenant_id, url, secret, cursor_xid, cursor_id)
		VALUES ($1::uuid, 'https://hooks.example/one', repeat('s', 32), $2::text::xid8, $3) RETURNING id::text`,
		t1, strconv.FormatUint(c5.XID, 10), c5.ID).Scan(&w1); err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO webhook_deliveries (webhook_id, event_id) VALUES ($1::uuid, $2)`, w1, c5.ID)
	exec(`UPDATE webhooks SET cursor_xid = $2::text::xid8, cursor_id = $3 WHERE id = $1::uuid`, w2, strconv.FormatUint(c4.XID, 10), c4.ID)
	if n, err := st.PruneEvents(ctx, 30*24*time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("second prune removed %d (%v), want 1 (e4; e5 has a pending delivery)", n, err)
	}
	if n, err := st.PruneEvents(ctx, 30*24*time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("third prune removed %d (%v), want 0", n, err)
	}

	// The log stays append-only outside retention, and even retention's setting does not
	// let a young event go.
	for _, q := range []string{`DELETE FROM events WHERE type = 'test.e5'`,
		`SELECT set_config('gpuaas.pruning_events', 'on', false); DELETE FROM events WHERE type = 'test.e6'`} {
		if _, err := conn.Exec(ctx, q); !errors.Is(store.Translate(err), store.ErrInvalid) {
			t.Fatalf("%s: %v, want refused", q, err)
		}
	}
}
