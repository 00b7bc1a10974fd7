package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/store"
)

// appendHeld appends an event in a transaction that stays open until release is called (at
// the latest when the test ends); it reports on appended once the row is written.
func appendHeld(t *testing.T, st *store.Store, typ string, appended chan<- struct{}) (release func(), done <-chan error) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	errc := make(chan error, 1)
	go func() {
		errc <- st.InTx(context.Background(), func(tx *store.Tx) error {
			if err := tx.AppendEvent(context.Background(), store.NewEvent{Type: typ}); err != nil {
				return err
			}
			appended <- struct{}{}
			<-ch
			return nil
		})
	}()
	return release, errc
}

func appendNow(t *testing.T, st *store.Store, typ string) {
	t.Helper()
	if err := st.InTx(context.Background(), func(tx *store.Tx) error {
		return tx.AppendEvent(context.Background(), store.NewEvent{Type: typ})
	}); err != nil {
		t.Fatal(err)
	}
}

// A transaction that took its id first but commits last must not be skipped by a reader that
// already holds the cursor of a later id: the log shows nothing past the oldest transaction
// still writing.
func TestEventCursorSkipsNothingCommittedOutOfOrder(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	appended := make(chan struct{})
	release, slow := appendHeld(t, st, "test.slow", appended)
	<-appended
	appendNow(t, st, "test.fast") // a higher id, committed first

	evs, cur, err := st.ReadEvents(ctx, store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 0 {
		t.Fatalf("read %d events while an older writer is in flight (%s first): a cursor past it would skip it", len(evs), evs[0].Type)
	}
	release()
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	// Other tests' transactions share the cluster and hold the horizon back a moment.
	for deadline := time.Now().Add(30 * time.Second); len(evs) < 2 && time.Now().Before(deadline); {
		var more []store.Event
		if more, cur, err = st.ReadEvents(ctx, store.EventFilter{After: cur}); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, more...)
	}
	if len(evs) != 2 || evs[0].Type != "test.slow" || evs[1].Type != "test.fast" {
		t.Fatalf("after both commits: %+v", evs)
	}
	again, next, err := st.ReadEvents(ctx, store.EventFilter{After: cur})
	if err != nil || len(again) != 0 || next != cur {
		t.Fatalf("resume from the last cursor: %d events, next %v (want none, %v), %v", len(again), next, cur, err)
	}
	head, err := st.EventHead(ctx)
	if err != nil || head != cur {
		t.Fatalf("head %v, %v; want %v", head, err, cur)
	}
}

// Many writers, transactions of random length, some rolled back, and a reader resuming by
// cursor the whole time: it sees every committed event exactly once, in cursor order. It runs
// beside the package's other tests, whose transactions (in other databases of the cluster)
// take ids from the same counter and hold the horizon back now and then.
//
// The cluster's transaction ids first jump to just below a power of ten, and one transaction
// that took the last id below it stays open until the writers have committed past it: the
// page the reader reads when it ends holds ids of both digit counts (where a text order of the
// ids would part from their order).
func TestEventCursorConcurrentWritersNoGapsNoDuplicates(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	boundary := nearDigitBoundary(t, url, 20)
	appended := make(chan struct{})
	release, held := appendHeld(t, st, "test.held", appended)
	<-appended
	const writers, perWriter, releaseAfter = 8, 25, 150
	var wg sync.WaitGroup
	var mu sync.Mutex
	committed := 1 // events in committed transactions, the held one's included
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range perWriter {
				typ := fmt.Sprintf("test.w%d_%d", w, i)
				rollback := r.IntN(5) == 0
				n := 1 + r.IntN(3)
				err := st.InTx(ctx, func(tx *store.Tx) error {
					for k := range n {
						if err := tx.AppendEvent(ctx, store.NewEvent{Type: fmt.Sprintf("%s.e%d", typ, k)}); err != nil {
							return err
						}
						if r.IntN(2) == 0 {
							// Hold the transaction open across other writers' commits.
							select {
							case <-time.After(time.Duration(r.IntN(3)) * time.Millisecond):
							case <-ctx.Done():
							}
						}
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				if err != nil && !errors.Is(err, errRollback) {
					t.Error(err)
					return
				}
				if !rollback {
					mu.Lock()
					committed += n
					mu.Unlock()
				}
			}
		}()
	}
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()

	seen := map[string]int{}
	var cur store.EventCursor
	finished, total := false, 0
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-writersDone:
			finished = true
		default:
		}
		mu.Lock()
		if committed > releaseAfter {
			release()
		}
		mu.Unlock()
		evs, next, err := st.ReadEvents(ctx, store.EventFilter{After: cur, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if !cur.Less(e.Cursor) {
				t.Fatalf("cursor went back: %v after %v", e.Cursor, cur)
			}
			cur = e.Cursor
			seen[e.Type]++
			total++
		}
		if next != cur {
			t.Fatalf("next cursor %v, last event %v", next, cur)
		}
		if finished && total >= committed {
			break
		}
	}
	if !finished || total != committed {
		t.Fatalf("writers finished %v; the resuming reader saw %d of %d committed events", finished, total, committed)
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	var events int
	for typ, n := range seen {
		if n != 1 {
			t.Errorf("%s seen %d times", typ, n)
		}
		events++
	}
	all, _, err := st.ReadEvents(ctx, store.EventFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != events {
		t.Fatalf("the resuming reader saw %d events, the log holds %d", events, len(all))
	}
	for _, e := range all {
		if seen[e.Type] != 1 {
			t.Fatalf("committed event %s never reached the resuming reader", e.Type)
		}
	}
	if committed == 0 {
		t.Fatal("no transaction committed")
	}
	if boundary != 0 && (all[0].Cursor.XID >= boundary || all[len(all)-1].Cursor.XID < boundary) {
		t.Logf("the transaction ids %d..%d did not cross %d (other tests took the ids in between)", all[0].Cursor.XID, all[len(all)-1].Cursor.XID, boundary)
	}
}

var errRollback = errors.New("roll back on purpose")

// nearDigitBoundary spends transaction ids (one committed transaction each, about 150,000 a
// second) until the cluster's next one is at most margin below the next power of ten. It
// spends none when that is more than 200,000 away (the test then runs within one digit
// count, and says so).
func nearDigitBoundary(t *testing.T, url string, margin uint64) (boundary uint64) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var next uint64
	if err := conn.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	p := uint64(10)
	for p <= next+margin {
		p *= 10
	}
	spend := p - margin - next
	if spend > 200_000 {
		t.Logf("next transaction id %d: %d ids below %d, too many to spend; the writers stay within one digit count", next, p-next, p)
		return 0
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`, spend)); err != nil {
		t.Fatal(err)
	}
	t.Logf("spent %d transaction ids: the next is about %d, %d below %d", spend, next+spend, margin, p)
	return p
}

func TestEventLogIsAppendOnlyAndCursorsAreChecked(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	appendNow(t, st, "test.one")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{`UPDATE events SET type = 'test.two'`, `DELETE FROM events`} {
		if _, err := conn.Exec(ctx, q); !errors.Is(store.Translate(err), store.ErrInvalid) {
			t.Fatalf("%s: %v, want refused", q, err)
		}
	}
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		return tx.AppendEvent(ctx, store.NewEvent{Type: "Not A Type"})
	}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("bad type: %v", err)
	}
	for _, bad := range []string{"x", "1-", "-1", "1-2-3", "01-2", "1--2", "18446744073709551616-1"} {
		if _, err := store.ParseEventCursor(bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("cursor %q: %v", bad, err)
		}
	}
	c, err := store.ParseEventCursor("12-34")
	if err != nil || c.String() != "12-34" {
		t.Fatalf("round trip: %v %v", c, err)
	}
}

// A log whose events carry transaction ids the cluster has not reached (a logical restore
// into another cluster) is detected; a normal one is not.
func TestEventClockBehind(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	appendNow(t, st, "test.one")
	if behind, err := st.EventClockBehind(ctx); err != nil || behind {
		t.Fatalf("fresh log: behind %v, %v", behind, err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO events (type, xid) VALUES ('test.restored', '9000000000000')`); err != nil {
		t.Fatal(err)
	}
	if behind, err := st.EventClockBehind(ctx); err != nil || !behind {
		t.Fatalf("restored log: behind %v, %v", behind, err)
	}
}

// The log's order is numeric in the transaction id, also where ids gain a digit: "10" sorts
// before "9" as text, and a reader or the head that ordered by the id's text would jump from
// 9's predecessor to 10 and never see 9's events. Every reader of the log (a resuming reader,
// an operator's and a tenant's, the head, retention, webhook fan-out) is checked on events
// whose ids straddle 9/10 and 99/100, written with explicit ids far below the horizon, in an
// order that is neither their id order nor their text order.
func TestEventCursorOrdersTransactionIDsAsNumbers(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	conn := connect(t, url)
	var tenant string
	if err := conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ('digits') RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	var readable bool
	if err := conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot()) > '100'`).Scan(&readable); err != nil || !readable {
		t.Fatalf("the cluster's horizon is not past transaction 100 (%v): the explicit ids below would not be readable", err)
	}
	old := time.Now().Add(-40 * 24 * time.Hour)
	for _, xid := range []int{100, 9, 98, 10, 99, 11} {
		if _, err := conn.Exec(ctx, `INSERT INTO events (xid, type, tenant_id, created_at) VALUES ($1::text::xid8, $2, $3::uuid, $4)`,
			strconv.Itoa(xid), fmt.Sprintf("test.x%d", xid), tenant, old); err != nil {
			t.Fatal(err)
		}
	}
	want := []uint64{9, 10, 11, 98, 99, 100}
	var last string
	if err := conn.QueryRow(ctx, `SELECT xid::text || '-' || id FROM events WHERE type = 'test.x100'`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if head, err := st.EventHead(ctx); err != nil || head.String() != last {
		t.Errorf("head %v, %v; want the last event %s", head, err, last)
	}
	xids := func(evs []store.Event) []uint64 {
		var out []uint64
		for _, e := range evs {
			out = append(out, e.Cursor.XID)
		}
		return out
	}
	for _, f := range []store.EventFilter{{Limit: 1}, {Limit: 2, TenantID: tenant}, {Limit: 1000}} {
		var got []store.Event
		for {
			evs, next, err := st.ReadEvents(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) == 0 {
				break
			}
			got = append(got, evs...)
			f.After = next
		}
		if fmt.Sprint(xids(got)) != fmt.Sprint(want) {
			t.Errorf("resuming reader (limit %d, tenant %q) read transactions %v, want %v", f.Limit, f.TenantID, xids(got), want)
		}
	}
	all, _, err := st.ReadEvents(ctx, store.EventFilter{})
	if err != nil || len(all) != len(want) {
		t.Fatalf("read %d events (%v), want %d", len(all), err, len(want))
	}

	// Retention removes a prefix in the same order: 9 and 10, then a reader holding 9's
	// cursor is told it expired, and one holding 10's goes on at 11.
	if n, err := st.PruneEvents(ctx, 30*24*time.Hour, 2); err != nil || n != 2 {
		t.Fatalf("prune removed %d (%v), want 2", n, err)
	}
	var expired *store.CursorExpiredError
	if _, _, err := st.ReadEvents(ctx, store.EventFilter{After: all[0].Cursor}); !errors.As(err, &expired) || expired.PrunedThrough != all[1].Cursor {
		t.Fatalf("read after 9's event once 9 and 10 were pruned: %v, want cursor expired through %v", err, all[1].Cursor)
	}
	if evs, _, err := st.ReadEvents(ctx, store.EventFilter{After: all[1].Cursor}); err != nil || fmt.Sprint(xids(evs)) != fmt.Sprint(want[2:]) {
		t.Fatalf("read after 10's event: %v, %v; want %v", xids(evs), err, want[2:])
	}

	// A webhook's fan-out takes the tenant's events in the same order.
	var hook string
	if err := conn.QueryRow(ctx, `INSERT INTO webhooks (tenant_id, url, secret) VALUES ($1::uuid, 'https://hooks.example/digits', repeat('s', 32))
		RETURNING id::text`, tenant).Scan(&hook); err != nil {
		t.Fatal(err)
	}
	if n, err := st.FanOutWebhooks(ctx, 2); err != nil || n != 2 {
		t.Fatalf("fan-out made %d deliveries (%v), want 2", n, err)
	}
	var delivered []uint64
	rows, err := conn.Query(ctx, `SELECT e.xid::text::bigint FROM webhook_deliveries d JOIN events e ON e.id = d.event_id
		WHERE d.webhook_id = $1::uuid ORDER BY e.xid`, hook)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var x uint64
		if err := rows.Scan(&x); err != nil {
			t.Fatal(err)
		}
		delivered = append(delivered, x)
	}
	if rows.Err() != nil || fmt.Sprint(delivered) != fmt.Sprint(want[2:4]) {
		t.Fatalf("the webhook's first deliveries are of transactions %v (%v), want %v", delivered, rows.Err(), want[2:4])
	}
}
