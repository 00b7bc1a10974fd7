package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gpuaas/gpuaas/internal/store"
)

// The statements that update many nodes at once in the background (the heartbeat flush and
// the best-fit hint refresh, on every replica) lock the rows in id order. Locked in any other
// order, two of them sharing two nodes can each hold one and wait for the other: PostgreSQL
// breaks that deadlock after a second by failing one statement (a bench run hit it between
// three replicas' refreshes and a heartbeat of the whole fleet). Each test holds the lower
// node's row, starts the statement on both nodes (the higher one first in its input, the
// order a nested loop over that input would lock them), waits until it is blocked, and checks
// that it has not locked the higher node while it waits.
func TestHeartbeatFlushLocksNodesInIDOrder(t *testing.T) {
	st, url := open(t)
	low, high := twoNodes(t, st)
	assertLocksInOrder(t, url, low, high, func(ctx context.Context) error {
		at := time.Now()
		return st.RecordHeartbeats(ctx, []store.HeartbeatRecord{{NodeID: high, At: at}, {NodeID: low, At: at}})
	})
}

func TestCapacityRefreshLocksNodesInIDOrder(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	low, high := twoNodes(t, st)
	if _, err := st.RefreshCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, url)
	// One slot of each node disabled, the higher node's first: both hints are now one too high.
	for _, n := range []string{high, low} {
		if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'disabled'
			WHERE id = (SELECT id FROM node_resource_slots WHERE node_id = $1 ORDER BY slot_index LIMIT 1)`, n); err != nil {
			t.Fatal(err)
		}
	}
	assertLocksInOrder(t, url, low, high, func(ctx context.Context) error {
		n, err := st.RefreshCapacity(ctx)
		if err == nil && n != 2 {
			err = fmt.Errorf("refresh changed %d nodes, want 2", n)
		}
		return err
	})
	var stale int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM nodes n WHERE available_slots <>
		(SELECT count(*) FROM node_resource_slots s WHERE s.node_id = n.id AND s.status = 'available')`).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("%d nodes with a stale hint after the refresh, %v", stale, err)
	}
}

// twoNodes adds two nodes and returns their ids, lower first. The lower node's row is then
// rewritten, so a scan of the table meets the higher node first: a statement that locks in
// the order it reads locks the higher one first, whatever its plan.
func twoNodes(t *testing.T, st *store.Store) (low, high string) {
	t.Helper()
	a, b := addNode(t, st, "order-a", 70).ID, addNode(t, st, "order-b", 71).ID
	if a > b { // uuid order is the byte order of the canonical text form
		a, b = b, a
	}
	err := st.InTx(context.Background(), func(tx *store.Tx) error {
		_, err := tx.SetDraining(context.Background(), a, false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// assertLocksInOrder holds node low's row in a transaction, runs stmt, waits until stmt is
// blocked on a lock, and fails if node high's row is locked meanwhile; then lets stmt finish
// and fails if it failed.
func assertLocksInOrder(t *testing.T, url, low, high string, stmt func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder := connect(t, url)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE id = $1 FOR NO KEY UPDATE`, low); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- stmt(ctx) }()
	probe := connect(t, url)
	holderPID := holder.PgConn().PID()
	for blocked := false; !blocked; {
		select {
		case err := <-done:
			t.Fatalf("the statement finished while node %s was locked elsewhere: %v", low, err)
		case <-ctx.Done():
			t.Fatal("the statement never waited for the locked node")
		case <-time.After(5 * time.Millisecond):
		}
		if err := probe.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))`, holderPID).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
	}
	ptx, err := probe.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, lockErr := ptx.Exec(ctx, `SELECT 1 FROM nodes WHERE id = $1 FOR NO KEY UPDATE NOWAIT`, high)
	_ = ptx.Rollback(ctx)
	var pgErr *pgconn.PgError
	if errors.As(lockErr, &pgErr) && pgErr.Code == "55P03" {
		t.Errorf("the statement holds node %s while it waits for node %s: it locks nodes out of id order", high, low)
	} else if lockErr != nil {
		t.Fatal(lockErr)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the statement, once unblocked: %v", err)
	}
}
