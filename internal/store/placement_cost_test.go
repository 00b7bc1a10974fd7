package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/store"
)

// windowBuffers runs the placement window's candidate statement under EXPLAIN (ANALYZE,
// BUFFERS) with the generic plan production uses, and returns the candidates it found and the
// buffers it touched.
func windowBuffers(t *testing.T, conn *pgx.Conn) (rows, buffers int) {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	var plan []byte
	err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+store.WindowSQL,
		"h200-sxm-slice", "", "", 0.0, 1, -1, "", 8).Scan(&plan)
	if err != nil {
		t.Fatal(err)
	}
	var out []struct {
		Plan struct {
			Rows int `json:"Actual Rows"`
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &out); err != nil || len(out) != 1 {
		t.Fatalf("plan %s: %v", plan, err)
	}
	t.Logf("window statement: %d rows, %d buffers", out[0].Plan.Rows, out[0].Plan.Hit+out[0].Plan.Read)
	return out[0].Plan.Rows, out[0].Plan.Hit + out[0].Plan.Read
}

// refreshAndConnect recounts the best-fit hint (so the new nodes are in windows) and opens a
// plain connection for EXPLAIN, closed when the test ends.
func refreshAndConnect(t *testing.T, st *store.Store, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	if _, err := st.RefreshCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// A node's allocation history must not make placement on it slower: every check of the
// window's slot filter reads an index of live rows only. Released allocations leave dead
// entries in allocations_node until vacuum; the baremetal check once went through it and
// read them for every candidate slot (1,700 of 2,200 buffers of the statement in the
// 500-node bench, growing with every create and release).
func TestWindowCostIgnoresAllocationHistory(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "hist-0", 40)
	conn := refreshAndConnect(t, st, url)
	rows0, before := windowBuffers(t, conn)
	var err error
	if rows0 != 8 {
		t.Fatalf("the window finds %d candidate slots, want the node's 8", rows0)
	}
	// 400 allocations on the node, created and released: the history of a busy node.
	_, err = conn.Exec(ctx, `WITH t AS (INSERT INTO tenants (name) VALUES ('history') RETURNING id)
		INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
		SELECT t.id, 'h200-sxm-slice', 'gpu_slice', 1, '', $1, '{}' FROM t, generate_series(1, 400)`, n.ID)
	if err == nil {
		_, err = conn.Exec(ctx, `UPDATE allocations SET status = 'releasing', releasing_at = now() WHERE node_id = $1`, n.ID)
	}
	if err == nil {
		_, err = conn.Exec(ctx, `UPDATE allocations SET status = 'released', released_at = now(), placement_status = 'released' WHERE node_id = $1`, n.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	rows1, after := windowBuffers(t, conn)
	if rows1 != 8 {
		t.Fatalf("after the history the window finds %d candidate slots, want 8", rows1)
	}
	if after > before+8 {
		t.Fatalf("the candidate statement touched %d buffers with 400 released allocations on the node, %d without: placement cost grows with history", after, before)
	}
}

// Nor may the rest of the fleet's live claims: the VF and exclusive-claim checks probe their
// indexes by node, never scan every live claim for each candidate slot (PostgreSQL's planner
// did, flattening the checks into anti-joins, once the fleet was busy).
func TestWindowCostIgnoresOtherNodesClaims(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	addNode(t, st, "free-0", 60)
	for i := range 24 {
		addNode(t, st, fmt.Sprintf("busy-%02d", i), 61+i)
	}
	conn := refreshAndConnect(t, st, url)
	// Fill the busy nodes: 192 live slot claims, one 8-GPU allocation per node.
	_, err := conn.Exec(ctx, `WITH t AS (INSERT INTO tenants (name) VALUES ('busy') RETURNING id),
		a AS (INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
		      SELECT t.id, 'h200-sxm-slice', 'gpu_slice', 8, '', n.id, '{}' FROM t, nodes n WHERE n.name LIKE 'busy-%'
		      RETURNING id, node_id),
		s AS (UPDATE node_resource_slots s SET status = 'reserved' FROM a WHERE s.node_id = a.node_id
		      RETURNING s.id, s.node_id, s.capacity_metadata->>'fabric_vf_pci_address' AS vf)
		INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, fabric_vf_pci_address, resource_snapshot)
		SELECT a.id, s.node_id, s.id, 'slot', s.vf, '{}' FROM a JOIN s ON s.node_id = a.node_id`)
	if err != nil {
		t.Fatal(err)
	}
	var live int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM allocation_resource_claims WHERE status = 'reserved'`).Scan(&live); err != nil || live != 192 {
		t.Fatalf("%d live claims, %v; want 192", live, err)
	}
	if _, err := st.RefreshCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	// Production tables are analyzed (autovacuum); with no statistics at all the planner
	// guesses every partial index is empty and any scan of it is as good as a probe.
	if _, err := conn.Exec(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	rows, buffers := windowBuffers(t, conn)
	if rows != 8 {
		t.Fatalf("the window finds %d candidate slots, want free-0's 8", rows)
	}
	// One node of 8 candidate slots: a probe of each node-level check's index, the node's
	// slots and its live claims by node (16 buffers in all when written); scanning the 192
	// claims for each slot is many hundreds.
	if buffers > 150 {
		t.Fatalf("the candidate statement touched %d buffers for one node's 8 slots with 192 live claims elsewhere: it scans other nodes' claims", buffers)
	}
}
