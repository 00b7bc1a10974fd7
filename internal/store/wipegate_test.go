package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gpuaas/gpuaas/internal/store"
)

// wipeGateWorld is a node with its slots, a plain SQL session and an enrolled credential.
type wipeGateWorld struct {
	st     *store.Store
	conn   *pgx.Conn
	nodeID string
	slotID string // slot 0
	slot1  string
	serial string
}

func wipeGateSetup(t *testing.T, name string, host int) wipeGateWorld {
	t.Helper()
	st, url := open(t)
	n := addNode(t, st, name, host)
	slots, err := st.ListSlots(context.Background(), n.ID)
	if err != nil || len(slots) == 0 {
		t.Fatalf("slots: %v %v", slots, err)
	}
	w := wipeGateWorld{st: st, conn: connect(t, url), nodeID: n.ID, slotID: slots[0].ID, slot1: slots[1].ID, serial: "aa" + n.ID[:8]}
	if err := st.InTx(context.Background(), func(tx *store.Tx) error {
		return tx.RecordCredential(context.Background(), w.serial, n.ID, time.Now().Add(time.Hour))
	}); err != nil {
		t.Fatal(err)
	}
	return w
}

// walk moves the slot through statuses with plain SQL, failing the test on any refusal.
func (w wipeGateWorld) walk(t *testing.T, slot string, statuses ...string) {
	t.Helper()
	for _, s := range statuses {
		if _, err := w.conn.Exec(context.Background(), `UPDATE node_resource_slots SET status = $2 WHERE id = $1`, slot, s); err != nil {
			t.Fatalf("-> %s: %v", s, err)
		}
	}
}

func (w wipeGateWorld) needsWipe(t *testing.T, slot string) bool {
	t.Helper()
	var need bool
	if err := w.conn.QueryRow(context.Background(), `SELECT needs_wipe FROM node_resource_slots WHERE id = $1`, slot).Scan(&need); err != nil {
		t.Fatal(err)
	}
	return need
}

func wantGate(t *testing.T, what string, err error) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.ConstraintName != store.WipeGate {
		t.Fatalf("%s: want the database's wipe gate refusal, got %v", what, err)
	}
}

// Every way back into 'available' after a claim is refused by the database until a verified,
// signed proof is recorded: the operator's disable+enable, plain SQL (also with a forged
// health_metadata.last_wipe, which was all the old check read), clearing the flag by hand.
func TestWipeGateRefusesEveryPathToAvailable(t *testing.T) {
	w := wipeGateSetup(t, "wg-paths", 40)
	ctx := context.Background()
	w.walk(t, w.slotID, "reserved", "provisioning", "failed", "cleanup_blocked")
	if !w.needsWipe(t, w.slotID) {
		t.Fatal("a reserved slot must need a wipe")
	}
	// cleanup_blocked -> disabled -> available: two audited admin calls put an unwiped disk on sale before.
	w.walk(t, w.slotID, "disabled")
	err := w.st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.SetSlotEnabled(ctx, w.nodeID, 0, true, "")
		return err
	})
	var dbe *store.DBError
	if !errors.As(err, &dbe) || !errors.Is(err, store.ErrConflict) || dbe.Constraint != store.WipeGate {
		t.Fatalf("enable of an unwiped slot: want a wipe-gate conflict, got %v", err)
	}
	_, err = w.conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'available' WHERE id = $1`, w.slotID)
	wantGate(t, "plain SQL disabled -> available", err)
	_, err = w.conn.Exec(ctx, `UPDATE node_resource_slots SET needs_wipe = false WHERE id = $1`, w.slotID)
	wantGate(t, "clearing needs_wipe by hand", err)
	_, err = w.conn.Exec(ctx, `UPDATE node_resource_slots SET needs_wipe = false, status = 'available' WHERE id = $1`, w.slotID)
	wantGate(t, "clearing needs_wipe and enabling in one statement", err)

	// The cleanup path with a forged health_metadata "proof" (all the old check read).
	w.walk(t, w.slot1, "reserved", "provisioning", "active", "releasing", "cleanup")
	_, err = w.conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'available',
		health_metadata = '{"last_wipe": {"verified": true}}' WHERE id = $1`, w.slot1)
	wantGate(t, "plain SQL cleanup -> available with a forged last_wipe", err)
}

// A proof clears the gate only verified, signed by a credential of the slot's own node, and
// recorded while the slot holds no claim; proofs are append-only. The normal release path
// (cleanup -> available with a proof) and enabling a wiped disabled slot then work, and a
// reservation given back before its host had the plan needs no wipe.
func TestWipeGateOpensOnlyForASignedVerifiedProof(t *testing.T) {
	w := wipeGateSetup(t, "wg-proof", 41)
	other := addNode(t, w.st, "wg-other", 42)
	ctx := context.Background()
	record := func(p store.WipeProofRecord) error {
		return w.st.InTx(ctx, func(tx *store.Tx) error {
			_, err := tx.RecordWipeProof(ctx, p)
			return err
		})
	}
	if err := w.st.InTx(ctx, func(tx *store.Tx) error {
		return tx.RecordCredential(ctx, "bb"+other.ID[:8], other.ID, time.Now().Add(time.Hour))
	}); err != nil {
		t.Fatal(err)
	}
	w.walk(t, w.slotID, "reserved", "provisioning", "active")
	// A proof while a tenant holds the slot is no handover proof.
	if err := record(store.WipeProofRecord{SlotID: w.slotID, Verified: true, Method: "blkdiscard_zero_verify", Signature: "sig", SignerSerial: w.serial}); err != nil {
		t.Fatal(err)
	}
	if !w.needsWipe(t, w.slotID) {
		t.Fatal("a proof recorded during a live claim cleared the gate")
	}
	w.walk(t, w.slotID, "releasing", "cleanup")
	for name, p := range map[string]store.WipeProofRecord{
		"unsigned":                 {SlotID: w.slotID, Verified: true, Method: "blkdiscard_zero_verify"},
		"signed by another node":   {SlotID: w.slotID, Verified: true, Method: "blkdiscard_zero_verify", Signature: "sig", SignerSerial: "bb" + other.ID[:8]},
		"reported by another node": {SlotID: w.slotID, NodeID: other.ID, Verified: true, Method: "blkdiscard_zero_verify", Signature: "sig", SignerSerial: "bb" + other.ID[:8]},
	} {
		if err := record(p); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s proof: want refused (invalid), got %v", name, err)
		}
	}
	if err := record(store.WipeProofRecord{SlotID: w.slotID, Verified: false, Method: "blkdiscard_zero_verify", Error: "2 non-zero regions"}); err != nil {
		t.Fatal(err)
	}
	if !w.needsWipe(t, w.slotID) {
		t.Fatal("an unverified proof cleared the gate")
	}
	if err := record(store.WipeProofRecord{SlotID: w.slotID, Verified: true, Method: "blkdiscard_zero_verify", Signature: "sig", SignerSerial: w.serial}); err != nil {
		t.Fatal(err)
	}
	if w.needsWipe(t, w.slotID) {
		t.Fatal("a verified, signed proof after the claim did not clear the gate")
	}
	if _, err := w.conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'available',
		health_metadata = '{"last_wipe": {"verified": true}}' WHERE id = $1`, w.slotID); err != nil {
		t.Fatalf("cleanup -> available with a recorded proof: %v", err)
	}

	// disabled -> available after a repair wipe's proof.
	w.walk(t, w.slot1, "reserved", "provisioning", "failed", "cleanup_blocked", "disabled")
	if err := record(store.WipeProofRecord{SlotID: w.slot1, Verified: true, Method: "nvme_sanitize_verify", Signature: "sig", SignerSerial: w.serial}); err != nil {
		t.Fatal(err)
	}
	if err := w.st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.SetSlotEnabled(ctx, w.nodeID, 1, true, "")
		return err
	}); err != nil {
		t.Fatalf("enable after a verified wipe: %v", err)
	}

	// A reservation given back before provisioning touched nothing.
	w.walk(t, w.slotID, "reserved", "available")
	if w.needsWipe(t, w.slotID) {
		t.Fatal("reserved -> available left the slot needing a wipe")
	}

	proofs, err := w.st.WipeProofs(ctx, w.slotID, 10)
	if err != nil || len(proofs) != 3 {
		t.Fatalf("proofs kept for the slot: %d, %v; want 3 (the live-claim one, the failed one, the verified one)", len(proofs), err)
	}
	if _, err := w.conn.Exec(ctx, `UPDATE slot_wipe_proofs SET verified = true WHERE slot_id = $1`, w.slotID); err == nil {
		t.Fatal("a proof was rewritten")
	}
	if _, err := w.conn.Exec(ctx, `DELETE FROM slot_wipe_proofs WHERE slot_id = $1`, w.slotID); err == nil {
		t.Fatal("a proof was deleted")
	}
}
