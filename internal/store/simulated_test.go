package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gpuaas/gpuaas/internal/store"
)

// The database, not only the controller, refuses to sell a simulated host: with plain SQL on
// a session that does not set gpuaas.allow_simulated, a heartbeat saying sim marks the node,
// a slot claim and a node_exclusive claim on it are refused, the placement queries skip it,
// and a slot whose recorded wipe says simulated cannot go back to available. A session that
// sets the parameter (what --allow-simulated-hosts does) may do each.
func TestDatabaseRefusesSimulatedHostsWithoutTheSessionSetting(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "sim-0", 90)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	exec := func(sql string, args ...any) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	}
	wantRefused := func(what string, err error, msg string) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || !strings.Contains(pgErr.Message, msg) {
			t.Fatalf("%s: %v, want check_violation %q", what, err, msg)
		}
	}

	// A heartbeat flush writes the agent's facts; one that says sim marks the node for good.
	if err := exec(`UPDATE nodes SET agent_facts = '{"runtime": "sim"}' WHERE id = $1`, n.ID); err != nil {
		t.Fatal(err)
	}
	if err := exec(`UPDATE nodes SET agent_facts = '{"runtime": "libvirt"}' WHERE id = $1`, n.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetNode(ctx, n.ID); err != nil || !got.Simulated {
		t.Fatalf("node after a sim heartbeat then a libvirt one: simulated=%v %v, want true", got.Simulated, err)
	}
	wantRefused("clearing the mark", exec(`UPDATE nodes SET simulated = false WHERE id = $1`, n.ID), "only re-enrolling it")

	var tenant, slot, vf string
	if err := conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ('t') RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT id::text, capacity_metadata->>'fabric_vf_pci_address' FROM node_resource_slots
		WHERE node_id = $1 ORDER BY slot_index LIMIT 1`, n.ID).Scan(&slot, &vf); err != nil {
		t.Fatal(err)
	}
	claim := func(kind string) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var alloc string
		if err := tx.QueryRow(ctx, `INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
			VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 1, 'lab', $2, '{}') RETURNING id::text`, tenant, n.ID).Scan(&alloc); err != nil {
			return err
		}
		if kind == "slot" {
			_, err = tx.Exec(ctx, `INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, fabric_vf_pci_address, resource_snapshot)
				VALUES ($1, $2, $3, 'slot', $4, '{}')`, alloc, n.ID, slot, vf)
		} else {
			_, err = tx.Exec(ctx, `INSERT INTO allocation_resource_claims (allocation_id, node_id, claim_kind, resource_snapshot)
				VALUES ($1, $2, 'node_exclusive', '{}')`, alloc, n.ID)
		}
		if err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	wantRefused("slot claim", claim("slot"), "simulated hosts are not sold")
	wantRefused("node_exclusive claim", claim("node_exclusive"), "simulated hosts are not sold")
	// Through the store the refusal is its own error, which the API answers in its own words.
	if err := claim("slot"); !errors.Is(store.Translate(err), store.ErrSimulated) {
		t.Fatalf("translated refusal: %v", err)
	}
	if c, err := st.SliceCandidates(ctx, store.PlacementQuery{SKU: "h200-sxm-slice"}); err != nil || len(c) != 0 {
		t.Fatalf("candidates on a simulated node: %d, %v; want none", len(c), err)
	}
	// The placement window (the create's hot path) reads the node and offers none of its slots.
	var w store.Window
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		w, err = tx.SliceWindow(ctx, store.WindowRequest{Query: store.PlacementQuery{SKU: "h200-sxm-slice"}, GPUs: 1, Limit: 10})
		return err
	}); err != nil || len(w.Candidates) != 0 {
		t.Fatalf("window on a simulated node: %d candidates, %v; want none", len(w.Candidates), err)
	}
	if b, err := st.SliceBlockers(ctx, store.PlacementQuery{SKU: "h200-sxm-slice"}); err != nil || b.OnSimulatedNodes != 8 {
		t.Fatalf("blockers %+v, %v; want 8 slots on simulated nodes", b, err)
	}

	// A slot whose last wipe is simulated stays off sale, whatever the path to available.
	if err := exec(`UPDATE node_resource_slots SET status = 'disabled' WHERE id = $1`, slot); err != nil {
		t.Fatal(err)
	}
	if err := exec(`UPDATE node_resource_slots SET health_metadata = health_metadata || '{"last_wipe": {"verified": true, "method": "simulated"}}' WHERE id = $1`, slot); err != nil {
		t.Fatal(err)
	}
	wantRefused("available on a simulated wipe", exec(`UPDATE node_resource_slots SET status = 'available' WHERE id = $1`, slot), "simulated wipe")

	// The session parameter --allow-simulated-hosts sets allows each.
	if err := exec(`SET gpuaas.allow_simulated = 'on'`); err != nil {
		t.Fatal(err)
	}
	if err := exec(`UPDATE node_resource_slots SET status = 'available' WHERE id = $1`, slot); err != nil {
		t.Fatalf("available on a simulated wipe, simulated hosts allowed: %v", err)
	}
	if err := claim("slot"); err != nil {
		t.Fatalf("slot claim, simulated hosts allowed: %v", err)
	}
	lax, err := store.Open(ctx, url, store.Options{AllowSimulated: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lax.Close()
	if c, err := lax.SliceCandidates(ctx, store.PlacementQuery{SKU: "h200-sxm-slice"}); err != nil || len(c) != 7 {
		t.Fatalf("candidates with simulated hosts allowed: %d, %v; want the 7 unclaimed slots", len(c), err)
	}
}

// A lab host (hostd enrolled with --lab-host: emulated GPU and fabric stand-ins) is simulated
// like a sim host: a heartbeat whose facts say lab_host marks the node, and a later heartbeat
// without it does not clear the mark.
func TestLabHostHeartbeatMarksTheNodeSimulated(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "labhost-0", 91)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	for _, facts := range []string{`{"runtime": "libvirt", "lab_host": true}`, `{"runtime": "libvirt"}`} {
		if _, err := conn.Exec(ctx, `UPDATE nodes SET agent_facts = $2::jsonb WHERE id = $1`, n.ID, facts); err != nil {
			t.Fatal(err)
		}
		if got, err := st.GetNode(ctx, n.ID); err != nil || !got.Simulated {
			t.Fatalf("node after heartbeat %s: simulated=%v %v, want true", facts, got.Simulated, err)
		}
	}
}
