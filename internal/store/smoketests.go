package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Image smoke tests (migration 024): a validation allocation per test; the allocation's
// outcome is the test's result.

// InsertSmokeTest records that allocationID (on nodeID, booting imageID at digest) is a
// smoke test of that image; the database checks the allocation boots exactly that.
func (t *Tx) InsertSmokeTest(ctx context.Context, imageID, digest, allocationID, nodeID, requestedBy string) (string, error) {
	var id string
	err := t.tx.QueryRow(ctx, `INSERT INTO image_smoke_tests (image_id, digest_sha256, allocation_id, node_id, requested_by)
		VALUES ($1, $2, $3, $4, $5) RETURNING id::text`, imageID, digest, allocationID, nodeID, requestedBy).Scan(&id)
	return id, translate(err)
}

const smokeTestColumns = `t.id::text, i.slug, t.digest_sha256, n.name, t.allocation_id::text,
		CASE WHEN image_smoke_gpu_failed(t.allocation_id) THEN 'failed' WHEN a.active_at IS NOT NULL THEN 'passed'
		     WHEN a.status = 'failed' THEN 'failed' ELSE 'running' END,
		a.status, a.failure_reason,
		coalesce((extract(epoch FROM a.active_at - a.created_at) * 1000)::bigint, 0), n.simulated, t.started_at,
		t.digest_sha256 = coalesce(i.digest_sha256, ''), image_smoke_gpu_check(t.allocation_id)
	FROM image_smoke_tests t JOIN os_images i ON i.id = t.image_id JOIN allocations a ON a.id = t.allocation_id
	JOIN nodes n ON n.id = t.node_id`

func scanSmokeTest(row pgx.Row, s *apiv1.ImageSmokeTest) error {
	return row.Scan(&s.ID, &s.Image, &s.DigestSHA256, &s.Node, &s.AllocationID, &s.Status, &s.AllocationStatus, &s.FailureReason,
		&s.TimeToReadyMS, &s.Simulated, &s.StartedAt, &s.Current, &s.GPUCheck)
}

// SmokeTests lists an image's smoke tests, newest first. ErrNotFound when there is no such
// image.
func (s *Store) SmokeTests(ctx context.Context, image string) ([]apiv1.ImageSmokeTest, error) {
	im, err := getImage(ctx, s.pool, image, false)
	if err != nil {
		return nil, err
	}
	out, err := queryAll(ctx, s.pool, scanSmokeTest, `SELECT `+smokeTestColumns+` WHERE t.image_id = $1 ORDER BY t.started_at DESC`, im.ID)
	if out == nil {
		out = []apiv1.ImageSmokeTest{}
	}
	return out, err
}

// SmokeTest is one smoke test by id.
func (s *Store) SmokeTest(ctx context.Context, id string) (apiv1.ImageSmokeTest, error) {
	var out apiv1.ImageSmokeTest
	if !IsUUID(id) {
		return out, ErrNotFound
	}
	return out, translate(scanSmokeTest(s.pool.QueryRow(ctx, `SELECT `+smokeTestColumns+` WHERE t.id = $1`, id), &out))
}

// ErrNoPassedSmokeTest is an activation of an image whose current digest has no passed
// smoke test.
var ErrNoPassedSmokeTest = errors.New("no passed smoke test of the image's digest")

// ActivateImage makes an image active (and no longer retired) once a smoke test of its
// current digest passed; ErrNoPassedSmokeTest otherwise.
func (t *Tx) ActivateImage(ctx context.Context, idOrSlug string) (apiv1.OSImage, error) {
	cur, err := getImage(ctx, t.tx, idOrSlug, true)
	if err != nil {
		return cur, err
	}
	tag, err := t.tx.Exec(ctx, `UPDATE os_images SET active = true, retired_at = NULL, updated_at = now()
		WHERE id = $1 AND digest_sha256 IS NOT NULL AND image_smoke_passed(id, digest_sha256)`, cur.ID)
	if err != nil {
		return cur, translate(err)
	}
	if tag.RowsAffected() == 0 {
		return cur, ErrNoPassedSmokeTest
	}
	return getImage(ctx, t.tx, cur.ID, false)
}

// EnsureTenant returns the id of the tenant named name, creating it if needed.
func (t *Tx) EnsureTenant(ctx context.Context, name string) (string, error) {
	var id string
	err := t.tx.QueryRow(ctx, `SELECT id::text FROM tenants WHERE name = $1`, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		tn, err := t.CreateTenant(ctx, name)
		return tn.ID, err
	}
	return id, translate(err)
}

// SmokePassed says whether a smoke test of image imageID at digest passed.
func (t *Tx) SmokePassed(ctx context.Context, imageID, digest string) (bool, error) {
	var ok bool
	err := t.tx.QueryRow(ctx, `SELECT image_smoke_passed($1, $2)`, imageID, digest).Scan(&ok)
	return ok, translate(err)
}
