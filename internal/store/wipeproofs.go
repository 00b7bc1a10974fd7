package store

import (
	"context"
	"time"
)

// WipeProofRecord is one row of slot_wipe_proofs: a host's proof that a slot's disk was
// erased and read back clean (or why not). A verified row clears the slot's wipe gate
// (migration 015); the database refuses a verified row without a signature and a signer
// certificate enrolled for the slot's node.
type WipeProofRecord struct {
	ID             int64     `json:"id"`
	SlotID         string    `json:"slot_id"`
	NodeID         string    `json:"node_id,omitempty"` // the reporting node; empty: the slot's own
	AllocationID   string    `json:"allocation_id,omitempty"`
	TaskID         string    `json:"task_id,omitempty"`
	Verified       bool      `json:"verified"`
	Method         string    `json:"method"`
	DeviceIdentity string    `json:"device_identity,omitempty"`
	FinishedAt     time.Time `json:"finished_at,omitzero"`
	Document       string    `json:"document,omitempty"` // the signed proof document (JSON), byte for byte
	Signature      string    `json:"signature,omitempty"`
	SignerSerial   string    `json:"signer_serial,omitempty"`
	SignerCert     string    `json:"signer_cert,omitempty"`
	Error          string    `json:"error,omitempty"`
	RecordedAt     time.Time `json:"recorded_at"`
}

// RecordWipeProof appends a proof for a slot.
func (t *Tx) RecordWipeProof(ctx context.Context, p WipeProofRecord) (int64, error) {
	var finished *time.Time
	if !p.FinishedAt.IsZero() {
		finished = &p.FinishedAt
	}
	var id int64
	err := t.tx.QueryRow(ctx, `INSERT INTO slot_wipe_proofs (slot_id, node_id, allocation_id, task_id, verified, method,
			device_identity, finished_at, document, signature, signer_serial, signer_cert, error)
		SELECT s.id, coalesce($2::uuid, s.node_id), $3::uuid, $4::uuid, $5, $6, $7, $8, $9, $10, $11, $12, $13
		FROM node_resource_slots s WHERE s.id = $1
		RETURNING id`, p.SlotID, nullIfEmpty(p.NodeID), nullIfEmpty(p.AllocationID), nullIfEmpty(p.TaskID), p.Verified, p.Method,
		p.DeviceIdentity, finished, p.Document, p.Signature, nullIfEmpty(p.SignerSerial), p.SignerCert, p.Error).Scan(&id)
	return id, translate(err)
}

// SlotNeedsWipe reports whether a slot has held a claim since its last verified wipe.
func (t *Tx) SlotNeedsWipe(ctx context.Context, slotID string) (bool, error) {
	var need bool
	err := t.tx.QueryRow(ctx, `SELECT needs_wipe FROM node_resource_slots WHERE id = $1`, slotID).Scan(&need)
	return need, translate(err)
}

// WipeProofs lists a slot's proofs, newest first (at most limit).
func (s *Store) WipeProofs(ctx context.Context, slotID string, limit int) ([]WipeProofRecord, error) {
	return s.wipeProofs(ctx, `slot_id = $1`, slotID, limit)
}

// AllocationWipeProofs lists the proofs recorded for an allocation's release, newest first.
func (s *Store) AllocationWipeProofs(ctx context.Context, allocationID string) ([]WipeProofRecord, error) {
	return s.wipeProofs(ctx, `allocation_id = $1`, allocationID, 256)
}

func (s *Store) wipeProofs(ctx context.Context, where, arg string, limit int) ([]WipeProofRecord, error) {
	if !IsUUID(arg) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id, slot_id::text, node_id::text, coalesce(allocation_id::text, ''), coalesce(task_id::text, ''),
			verified, method, device_identity, coalesce(finished_at, recorded_at), document, signature, coalesce(signer_serial, ''),
			signer_cert, error, recorded_at
		FROM slot_wipe_proofs WHERE `+where+` ORDER BY id DESC LIMIT $2`, arg, limit)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	var out []WipeProofRecord
	for rows.Next() {
		var p WipeProofRecord
		if err := rows.Scan(&p.ID, &p.SlotID, &p.NodeID, &p.AllocationID, &p.TaskID, &p.Verified, &p.Method, &p.DeviceIdentity,
			&p.FinishedAt, &p.Document, &p.Signature, &p.SignerSerial, &p.SignerCert, &p.Error, &p.RecordedAt); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, translate(rows.Err())
}
