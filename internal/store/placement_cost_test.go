package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/store"
)

// windowBuffers runs the placement window's candidate statement (a 1-GPU request's first
// window) under EXPLAIN (ANALYZE, BUFFERS) with the generic plan production uses, and returns
// the slot rows it found (the statement run again, as production reads it) and the buffers it
// touched.
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
		store.FirstWindowArgs("h200-sxm-slice", 1, 8, 1)...).Scan(&plan)
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
	slotRows := 0
	all, err := tx.Query(ctx, store.WindowSQL, store.FirstWindowArgs("h200-sxm-slice", 1, 8, 1)...)
	if err != nil {
		t.Fatal(err)
	}
	for all.Next() {
		if v, err := all.Values(); err != nil || len(v) == 0 {
			t.Fatalf("window row %v: %v", v, err)
		} else if v[0] == int32(1) {
			slotRows++
		}
	}
	if all.Close(); all.Err() != nil {
		t.Fatal(all.Err())
	}
	return slotRows, out[0].Plan.Hit + out[0].Plan.Read
}

// refreshAndConnect recounts the best-fit hint (so the new nodes are in windows) and opens a
// plain connection for EXPLAIN, closed when the test ends.
func refreshAndConnect(t *testing.T, st *store.Store, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	if _, err := st.RefreshCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, url)
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
	testWindowCostIgnoresOtherNodesClaims(t, false)
}

// Statistics taken while no claim was live (a quiet fleet's autovacuum, or the bench's settle
// before every run) make every live-claim partial index look empty, and any scan of one as
// cheap as a probe: the slot's holder was then found by scanning the whole fleet's live
// claims (claims_live_node, no condition) once per slot of the window, 14 buffers a slot at
// 16 clients and most of the window's buffers. The probe names the slot's node too, so each
// index it may use is entered at that node or slot.
func TestWindowCostIgnoresOtherNodesClaimsAfterAnEmptyAnalyze(t *testing.T) {
	testWindowCostIgnoresOtherNodesClaims(t, true)
}

func testWindowCostIgnoresOtherNodesClaims(t *testing.T, analyzeEmpty bool) {
	st, url := open(t)
	ctx := context.Background()
	addNode(t, st, "free-0", 60)
	for i := range 24 {
		addNode(t, st, fmt.Sprintf("busy-%02d", i), 61+i)
	}
	conn := refreshAndConnect(t, st, url)
	// Fill the busy nodes: 192 live slot claims, one 8-GPU allocation per node.
	fill := func() {
		t.Helper()
		_, err := conn.Exec(ctx, `WITH t AS (SELECT id FROM tenants WHERE name = 'busy'),
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
	}
	if _, err := conn.Exec(ctx, `INSERT INTO tenants (name) VALUES ('busy')`); err != nil {
		t.Fatal(err)
	}
	if analyzeEmpty {
		// A history of released allocations, analyzed while none is live.
		for range 10 {
			fill()
			if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'available' WHERE status = 'reserved';
				UPDATE allocation_resource_claims SET status = 'released', released_at = now() WHERE status = 'reserved';
				UPDATE allocations SET status = 'releasing' WHERE status = 'requested';
				UPDATE allocations SET status = 'released', released_at = now() WHERE status = 'releasing'`); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := conn.Exec(ctx, "VACUUM ANALYZE"); err != nil {
			t.Fatal(err)
		}
	}
	fill()
	var live int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM allocation_resource_claims WHERE status = 'reserved'`).Scan(&live); err != nil || live != 192 {
		t.Fatalf("%d live claims, %v; want 192", live, err)
	}
	if _, err := st.RefreshCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	// Production tables are analyzed (autovacuum); with no statistics at all the planner
	// guesses every partial index is empty and any scan of it is as good as a probe.
	if !analyzeEmpty {
		if _, err := conn.Exec(ctx, "ANALYZE"); err != nil {
			t.Fatal(err)
		}
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

// Nor may the nodes ahead of the window in best-fit order (the full ones, usually most of a
// busy fleet): the window starts at the request's size in the index, and finds its nodes by
// id, even where the tables have no statistics yet: a fleet just onboarded before
// autovacuum's first ANALYZE, or a database just upgraded (pg_upgrade carries no statistics
// over). Without them the planner found each window node by scanning the best-fit index from
// its start, running the node checks on every node it passed: the window's cost grew with
// the full nodes ahead of it.
func TestWindowCostIgnoresFullNodes(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	for i := range 40 {
		addNode(t, st, fmt.Sprintf("stat-%02d", i), 100+i)
	}
	conn := refreshAndConnect(t, st, url)
	_, before := windowBuffers(t, conn)
	// 32 nodes full: the window (nodes with a free slot) now starts after them.
	if _, err := conn.Exec(ctx, `UPDATE nodes SET available_slots = 0 WHERE name < 'stat-32'`); err != nil {
		t.Fatal(err)
	}
	var analyzed bool
	if err := conn.QueryRow(ctx, `SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL
		FROM pg_stat_user_tables WHERE relname = 'nodes'`).Scan(&analyzed); err != nil || analyzed {
		t.Fatalf("nodes analyzed %v, %v: this test is about a table without statistics", analyzed, err)
	}
	rows, after := windowBuffers(t, conn)
	if rows != 64 {
		t.Fatalf("the window finds %d candidate slots, want the 8 free nodes' 64", rows)
	}
	if after > before+40 {
		t.Fatalf("the window touched %d buffers with 32 full nodes ahead of it, %d with none: it reads the nodes it skips", after, before)
	}
	// And the best-fit index: 6,000 more full nodes ahead of the window (bare rows: only the
	// hint and the index see them) must not be walked either.
	if _, err := conn.Exec(ctx, `INSERT INTO nodes (name, region, slice_sku, available_slots, last_heartbeat_at)
		SELECT 'full-' || i, 'lab', 'h200-sxm-slice', 0, now() FROM generate_series(1, 6000) i`); err != nil {
		t.Fatal(err)
	}
	rows, busy := windowBuffers(t, conn)
	if rows != 64 {
		t.Fatalf("with 6,000 full nodes the window finds %d candidate slots, want 64", rows)
	}
	if busy > after+40 { // a deeper primary-key index costs ~20; walking 6,000 entries ~80
		t.Fatalf("the window touched %d buffers with 6,000 more full nodes ahead of it, %d without: it walks their index entries", busy, after)
	}
}

// refreshBuffers marks node's first slot changed and runs the capacity refresh under EXPLAIN
// (ANALYZE, BUFFERS) in a transaction it rolls back; it returns the buffers the refresh
// touched.
func refreshBuffers(t *testing.T, conn *pgx.Conn, node string) int {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `UPDATE node_resource_slots SET status = 'reserved' WHERE node_id = $1 AND slot_index = 0`, node); err != nil {
		t.Fatal(err)
	}
	var plan []byte
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+store.RefreshCapacitySQL).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var out []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &out); err != nil || len(out) != 1 {
		t.Fatalf("plan %s: %v", plan, err)
	}
	var free int
	if err := tx.QueryRow(ctx, `SELECT available_slots FROM nodes WHERE id = $1`, node).Scan(&free); err != nil || free != 7 {
		t.Fatalf("after the refresh the node's hint reads %d available slots (%v), want 7", free, err)
	}
	t.Logf("capacity refresh: %d buffers", out[0].Plan.Hit+out[0].Plan.Read)
	return out[0].Plan.Hit + out[0].Plan.Read
}

// The capacity refresh runs every 10 ms under load: its cost must follow the nodes that
// changed, not the fleet. It read every node twice (the planner hashed the dirty rows and
// scanned nodes to join them) until it looked the changed nodes up by id.
func TestCapacityRefreshCostIgnoresFleetSize(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "refresh-0", 40)
	conn := connect(t, url)
	if _, err := st.RefreshCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	// As production's tables are: analyzed, and the dirty table emptied by the refresh and
	// truncated by vacuum, so the planner guesses its size (10 pages: some 1,500 rows).
	vacuum := func() {
		t.Helper()
		if _, err := conn.Exec(ctx, "VACUUM ANALYZE"); err != nil {
			t.Fatal(err)
		}
	}
	vacuum()
	before := refreshBuffers(t, conn, n.ID)
	if _, err := conn.Exec(ctx, `INSERT INTO nodes (name, region, slice_sku, available_slots, last_heartbeat_at)
		SELECT 'other-' || i, 'lab', 'h200-sxm-slice', 8, now() FROM generate_series(1, 6000) i`); err != nil {
		t.Fatal(err)
	}
	vacuum()
	if after := refreshBuffers(t, conn, n.ID); after > before+40 { // a deeper primary key costs a few; a scan of 6,000 nodes over 100
		t.Fatalf("the refresh of one changed node touched %d buffers in a fleet of 6,001 nodes, %d in a fleet of one: it reads the fleet", after, before)
	}
}
