package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Warm slots (migration 028): the slots a host may stage its SKU's default image on, and
// the record of a staging once the host reports it done.

// StageCandidate is an idle slot of a warm SKU with nothing staged and no staging queued or
// running, with the image to stage on it (the SKU's default, as a request naming none would
// resolve it) and the verified wipe proof the staging follows.
type StageCandidate struct {
	SlotID       string
	NVMeDevice   string
	DiskIdentity string
	AfterProof   int64
	Image        ResolvedImage
}

// StageCandidates lists nodeID's slots to stage. A slot qualifies only when it is available,
// healthy (a slot held for its validation is quarantined), owes no wipe, has a verified wipe
// proof, and its node's slice SKU has warm_slots; a SKU without a viable default image
// yields none.
func (s *Store) StageCandidates(ctx context.Context, nodeID string) ([]StageCandidate, error) {
	if !IsUUID(nodeID) {
		return nil, ErrNotFound
	}
	rows, err := s.pool.Query(ctx, `SELECT s.id::text, s.nvme_device, coalesce(s.capacity_metadata->>'disk_identity', ''), n.slice_sku,
			(SELECT max(p.id) FROM slot_wipe_proofs p WHERE p.slot_id = s.id AND p.verified)
		FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
		JOIN sku_catalog k ON k.sku = n.slice_sku AND k.warm_slots
		WHERE s.node_id = $1 AND s.status = 'available' AND s.health = 'healthy' AND NOT s.needs_wipe
		  AND s.staged_digest_sha256 IS NULL AND s.nvme_device <> ''
		  AND NOT EXISTS (SELECT 1 FROM node_tasks t WHERE t.node_id = $1 AND t.type = 'slot.image_stage'
		                  AND t.status IN ('queued', 'leased') AND t.payload->>'slot_id' = s.id::text)
		ORDER BY s.slot_index`, nodeID)
	if err != nil {
		return nil, translate(err)
	}
	type row struct {
		c   StageCandidate
		sku string
		pf  *int64
	}
	var got []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.c.SlotID, &r.c.NVMeDevice, &r.c.DiskIdentity, &r.sku, &r.pf); err != nil {
			rows.Close()
			return nil, translate(err)
		}
		got = append(got, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, translate(err)
	}
	var out []StageCandidate
	images := map[string]*ResolvedImage{}
	for _, r := range got {
		if r.pf == nil {
			continue // never proven clean: nothing to stage after
		}
		img, ok := images[r.sku]
		if !ok {
			ri, err := s.ResolveSliceImage(ctx, r.sku, "")
			if err != nil && err != ErrNotFound {
				return nil, err
			}
			if err == nil {
				img = &ri
			}
			images[r.sku] = img
		}
		if img == nil {
			continue
		}
		r.c.AfterProof, r.c.Image = *r.pf, *img
		out = append(out, r.c)
	}
	return out, nil
}

// NodesOfSliceSKU are the ids of the nodes whose slices are sku.
func (s *Store) NodesOfSliceSKU(ctx context.Context, sku string) ([]string, error) {
	return queryAll(ctx, s.pool, func(r pgx.Row, id *string) error { return r.Scan(id) },
		`SELECT id::text FROM nodes WHERE slice_sku = $1 ORDER BY name`, sku)
}

// RecordStaged records that imageID (at digest) was written onto slotID's disk after wipe
// proof afterProof. A slot that is no longer idle, or was wiped again since (another proof
// is its latest), is left alone: recorded reports false. The database refuses a record on a
// slot not proven clean (migration 028).
func (s *Store) RecordStaged(ctx context.Context, slotID, imageID, digest string, afterProof int64) (recorded bool, err error) {
	if !IsUUID(slotID) || !IsUUID(imageID) {
		return false, ErrNotFound
	}
	var id string
	err = s.pool.QueryRow(ctx, `UPDATE node_resource_slots s SET staged_image_id = $2, staged_digest_sha256 = $3, staged_at = now(),
			staged_after_proof = $4
		WHERE s.id = $1 AND s.status = 'available' AND s.health = 'healthy' AND NOT s.needs_wipe
		  AND $4 = (SELECT max(p.id) FROM slot_wipe_proofs p WHERE p.slot_id = s.id AND p.verified)
		RETURNING s.id::text`, slotID, imageID, digest, afterProof).Scan(&id)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	return err == nil, translate(err)
}
