package store_test

import (
	"context"
	"testing"
)

// A slot's status change, eight of them in every create+release, is a HOT update: no index of
// node_resource_slots refers to the status, and the table leaves room on its pages for a
// reservation's and a release's new versions. A non-HOT update writes a new entry in every
// index and leaves the old one for vacuum; the best-fit window then reads a busy node's slots
// through dozens of dead entries. (Three nodes: at the default fillfactor the first page holds
// 17 slots, and the first node's have no room left.)
func TestSlotStatusChangesAreHOTUpdates(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "hot-a", 50)
	addNode(t, st, "hot-b", 51)
	addNode(t, st, "hot-c", 52)
	conn := connect(t, url)
	slots, err := st.ListSlots(ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	group := []string{slots[0].ID, slots[1].ID, slots[2].ID, slots[3].ID}
	// A reservation and a release of one NUMA group, each its own transaction, with the
	// statement reservations and releases run.
	updated, hot := 0, 0
	for _, status := range []string{"reserved", "available"} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The session's counters since its last stats flush, which never happens inside a
		// transaction: the difference is this update's.
		counts := func() (u, h int) {
			t.Helper()
			if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated('node_resource_slots'::regclass),
				pg_stat_get_xact_tuples_hot_updated('node_resource_slots'::regclass)`).Scan(&u, &h); err != nil {
				t.Fatal(err)
			}
			return u, h
		}
		u0, h0 := counts()
		if _, err := tx.Exec(ctx, `UPDATE node_resource_slots SET status = $2, status_reason = '' WHERE id = ANY($1::uuid[])`, group, status); err != nil {
			t.Fatal(err)
		}
		u1, h1 := counts()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		updated, hot = updated+u1-u0, hot+h1-h0
	}
	if updated != 8 || hot != updated {
		t.Fatalf("%d of %d slot status updates were HOT; want all 8", hot, updated)
	}
}
