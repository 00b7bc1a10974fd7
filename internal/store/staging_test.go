package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// Warm slots in the database: a SKU asks for them (off by default); a slot is a staging
// candidate only once it is idle and proven clean by a verified wipe proof; a staging is
// recorded only against the slot's latest verified proof (plain SQL included); the record
// ends with the slot's next status change, and no index names it (status changes stay HOT).
func TestWarmSlotIsStagedOnlyAfterItsWipeProofAndForgottenOnReuse(t *testing.T) {
	w := wipeGateSetup(t, "warm", 60)
	ctx := context.Background()
	img := createImage(t, w.st, testImage("warm-image", 60))
	candidates := func() []store.StageCandidate {
		t.Helper()
		c, err := w.st.StageCandidates(ctx, w.nodeID)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := candidates(); len(c) != 0 {
		t.Fatalf("candidates of a SKU without warm slots: %+v", c)
	}
	on := true
	if err := w.st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.PatchSKU(ctx, "h200-sxm-slice", apiv1.SKUPatch{WarmSlots: &on})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if c := candidates(); len(c) != 0 {
		t.Fatalf("candidates before any wipe proof: %+v", c)
	}

	// Slot 0 serves a tenant, is wiped with a signed verified proof and goes back on sale.
	w.walk(t, w.slotID, "reserved", "provisioning", "active", "releasing", "cleanup")
	var proof int64
	if err := w.st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		proof, err = tx.RecordWipeProof(ctx, store.WipeProofRecord{SlotID: w.slotID, NodeID: w.nodeID, Verified: true,
			Method: "blkdiscard_zero_verify", Signature: "sig", SignerSerial: w.serial})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'available',
		health_metadata = '{"last_wipe": {"verified": true}}' WHERE id = $1`, w.slotID); err != nil {
		t.Fatal(err)
	}
	c := candidates()
	if len(c) != 1 || c[0].SlotID != w.slotID || c[0].AfterProof != proof || c[0].Image.Slug != "warm-image" {
		t.Fatalf("candidates after the proof: %+v; want slot 0 after proof %d with warm-image", c, proof)
	}

	// Not against an older proof, not on a slot never proven clean, not by plain SQL either.
	if ok, err := w.st.RecordStaged(ctx, w.slotID, img.ID, img.DigestSHA256, proof-1); ok || err != nil {
		t.Fatalf("staging against a stale proof: recorded=%v %v", ok, err)
	}
	for _, slot := range []string{w.slotID, w.slot1} {
		_, err := w.conn.Exec(ctx, `UPDATE node_resource_slots SET staged_image_id = $2, staged_digest_sha256 = $3, staged_at = now(),
			staged_after_proof = 0 WHERE id = $1`, slot, img.ID, img.DigestSHA256)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.ConstraintName != "slot_staging_gate" {
			t.Fatalf("plain SQL staging of %s without its latest proof: %v, want the staging gate", slot, err)
		}
	}
	if ok, err := w.st.RecordStaged(ctx, w.slotID, img.ID, img.DigestSHA256, proof); !ok || err != nil {
		t.Fatalf("staging after the latest proof: recorded=%v %v", ok, err)
	}
	slots, err := w.st.ListSlots(ctx, w.nodeID)
	if err != nil {
		t.Fatal(err)
	}
	if s := slots[0].StagedImage; s == nil || s.ImageID != img.ID || s.DigestSHA256 != img.DigestSHA256 || s.AfterProof != proof {
		t.Fatalf("slot 0 staged image: %+v", s)
	}
	if c := candidates(); len(c) != 0 {
		t.Fatalf("candidates with slot 0 staged: %+v", c)
	}

	// A quick validation leaves the disk and the record alone; a burn-in boots a VM from the
	// disk and wipes it again, which ends the record, however the run is recorded.
	for _, level := range []string{"quick", "burn-in"} {
		if err := w.st.InTx(ctx, func(tx *store.Tx) error {
			_, err := tx.RecordValidation(ctx, store.ValidationRecord{SlotID: w.slotID, NodeID: w.nodeID, Level: level, Passed: true})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		slots, err := w.st.ListSlots(ctx, w.nodeID)
		if err != nil {
			t.Fatal(err)
		}
		if staged := slots[0].StagedImage != nil; staged != (level == "quick") {
			t.Fatalf("slot 0 after a %s validation: staged %v", level, staged)
		}
	}
	if ok, err := w.st.RecordStaged(ctx, w.slotID, img.ID, img.DigestSHA256, proof); !ok || err != nil {
		t.Fatalf("staging again after the burn-in: recorded=%v %v", ok, err)
	}

	// The next reservation ends the record. No index names a staged column, so neither the
	// staging nor that status change costs a slot its HOT update (TestSlotStatusChangesAreHOTUpdates).
	var indexed int
	if err := w.conn.QueryRow(ctx, `SELECT count(*) FROM pg_index i WHERE i.indrelid = 'node_resource_slots'::regclass
		AND pg_get_indexdef(i.indexrelid) LIKE '%staged%'`).Scan(&indexed); err != nil || indexed != 0 {
		t.Fatalf("indexes naming a staged column: %d %v", indexed, err)
	}
	if _, err := w.conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'reserved' WHERE id = $1`, w.slotID); err != nil {
		t.Fatal(err)
	}
	if slots, err = w.st.ListSlots(ctx, w.nodeID); err != nil || slots[0].StagedImage != nil {
		t.Fatalf("slot 0 after its reservation still says staged: %+v %v", slots[0].StagedImage, err)
	}
}
