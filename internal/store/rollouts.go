package store

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// A SKU's default image pointer and its canary rollouts (migration 024). Placement reads
// the pointer and the canary with the SKU (SKUWithSliceImage) and gives each allocation the
// canary image when its node is in the canary (Canary.Includes), the default otherwise.

// Canary is a rollout in progress as placement applies it.
type Canary struct {
	RolloutID    string
	SharePercent int
	Regions      []string
	Image        ResolvedImage
}

// Includes says whether a node (in region) boots the canary image: every node of the named
// regions, and the nodes whose bucket (a hash of rollout and node ids, 0..99) falls below
// the share. The same node stays in or out for the whole rollout; a new rollout draws anew.
func (c *Canary) Includes(nodeID, region string) bool {
	if c == nil {
		return false
	}
	if slices.Contains(c.Regions, region) {
		return true
	}
	return CanaryBucket(c.RolloutID, nodeID) < c.SharePercent
}

// CanaryBucket is a node's bucket in a rollout, 0..99.
func CanaryBucket(rolloutID, nodeID string) int {
	h := fnv.New32a()
	h.Write([]byte(rolloutID))
	h.Write([]byte{'/'})
	h.Write([]byte(nodeID))
	return int(h.Sum32() % 100)
}

// canarySQL reads SKU $1's canary in progress when the request names no image ($2 = ”):
// its rollout and its image, if that image is still viable.
const canarySQL = `SELECT r.id::text, r.share_percent, r.regions,
		i.id::text, i.slug, i.source_type, i.source_ref, i.digest_sha256, i.image_format, i.default_username,
		i.signature, ` + skuRequiresSigned + `
	FROM sku_image_pointers p JOIN image_rollouts r ON r.id = p.rollout_id JOIN os_images i ON i.id = r.image_id
	WHERE p.sku = $1 AND $2 = '' AND ` + viableImage

func scanCanary(row pgx.Row) (*Canary, error) {
	var c Canary
	r := &c.Image
	err := row.Scan(&c.RolloutID, &c.SharePercent, &c.Regions, &r.ID, &r.Slug, &r.SourceType, &r.SourceRef, &r.DigestSHA256,
		&r.ImageFormat, &r.Username, &r.Signature, &r.SignatureRequired)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, translate(err)
	}
	return &c, nil
}

// NodeRegion is a node's region (placement asks only for a canary by region and a request
// that named none).
func (t *Tx) NodeRegion(ctx context.Context, nodeID string) (string, error) {
	var r string
	err := t.tx.QueryRow(ctx, `SELECT region FROM nodes WHERE id = $1`, nodeID).Scan(&r)
	return r, translate(err)
}

// lockPointer takes SKU sku's pointer row (nil when it has none), serializing rollout
// changes of one SKU. ErrNotFound when there is no such SKU.
func (t *Tx) lockPointer(ctx context.Context, sku string) (imageID, rolloutID *string, err error) {
	if _, err := getSKU(ctx, t.tx, sku, true); err != nil {
		return nil, nil, err
	}
	err = t.tx.QueryRow(ctx, `SELECT image_id::text, rollout_id::text FROM sku_image_pointers WHERE sku = $1 FOR UPDATE`, sku).
		Scan(&imageID, &rolloutID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil
	}
	return imageID, rolloutID, translate(err)
}

func conflict(constraint, detail string) error {
	return &DBError{Kind: ErrConflict, Constraint: constraint, Detail: detail}
}

// SetDefaultImage points SKU sku's default at image (id or slug) directly, without a canary:
// a SKU's first default, or an operator's deliberate switch. Refused while a canary runs.
func (t *Tx) SetDefaultImage(ctx context.Context, sku, image string) error {
	cur, rollout, err := t.lockPointer(ctx, sku)
	if err != nil {
		return err
	}
	if rollout != nil {
		return conflict("image_rollouts_one_canary", "a canary rollout of that SKU is in progress: promote or roll it back first")
	}
	im, err := getImage(ctx, t.tx, image, false)
	if err != nil {
		return err
	}
	if cur == nil {
		_, err = t.tx.Exec(ctx, `INSERT INTO sku_image_pointers (sku, image_id) VALUES ($1, $2)`, sku, im.ID)
	} else {
		_, err = t.tx.Exec(ctx, `UPDATE sku_image_pointers SET image_id = $2, updated_at = now() WHERE sku = $1`, sku, im.ID)
	}
	return translate(err)
}

// StartRollout starts a canary of image on SKU sku: it becomes the default on share percent
// of the SKU's nodes and on every node of regions. The SKU needs a default to compare with
// (SetDefaultImage) and no canary in progress.
func (t *Tx) StartRollout(ctx context.Context, sku string, in apiv1.ImageRolloutCreate) (apiv1.ImageRollout, error) {
	cur, rollout, err := t.lockPointer(ctx, sku)
	if err != nil {
		return apiv1.ImageRollout{}, err
	}
	if cur == nil {
		return apiv1.ImageRollout{}, conflict("sku_image_pointers_pkey",
			"the SKU has no default image yet: set one first (gpuaasctl images default SKU IMAGE)")
	}
	if rollout != nil {
		return apiv1.ImageRollout{}, conflict("image_rollouts_one_canary", "a canary rollout of that SKU is already in progress: promote or roll it back first")
	}
	im, err := getImage(ctx, t.tx, in.Image, false)
	if err != nil {
		return apiv1.ImageRollout{}, err
	}
	regions := in.Regions
	if regions == nil {
		regions = []string{}
	}
	var id string
	if err := t.tx.QueryRow(ctx, `INSERT INTO image_rollouts (sku, image_id, previous_image_id, share_percent, regions)
		VALUES ($1, $2, $3, $4, $5) RETURNING id::text`, sku, im.ID, *cur, in.SharePercent, regions).Scan(&id); err != nil {
		return apiv1.ImageRollout{}, translate(err)
	}
	if _, err := t.tx.Exec(ctx, `UPDATE sku_image_pointers SET rollout_id = $2, updated_at = now() WHERE sku = $1`, sku, id); err != nil {
		return apiv1.ImageRollout{}, translate(err)
	}
	return getRollout(ctx, t.tx, id)
}

// PromoteRollout makes SKU sku's canary image its default everywhere.
func (t *Tx) PromoteRollout(ctx context.Context, sku string) (apiv1.ImageRollout, error) {
	_, rollout, err := t.lockPointer(ctx, sku)
	if err != nil {
		return apiv1.ImageRollout{}, err
	}
	if rollout == nil {
		return apiv1.ImageRollout{}, conflict("image_rollouts_one_canary", "no canary rollout of that SKU is in progress")
	}
	if _, err := t.tx.Exec(ctx, `UPDATE image_rollouts SET status = 'promoted', finished_at = now() WHERE id = $1`, *rollout); err != nil {
		return apiv1.ImageRollout{}, translate(err)
	}
	if _, err := t.tx.Exec(ctx, `UPDATE sku_image_pointers p SET image_id = r.image_id, rollout_id = NULL, updated_at = now()
		FROM image_rollouts r WHERE p.sku = $1 AND r.id = $2`, sku, *rollout); err != nil {
		return apiv1.ImageRollout{}, translate(err)
	}
	return getRollout(ctx, t.tx, *rollout)
}

// RollBack ends SKU sku's canary (the default never moved), or, with none in progress, moves
// the pointer back to the image the last promoted rollout replaced. It only moves the
// pointer: allocations keep the image they recorded.
func (t *Tx) RollBack(ctx context.Context, sku string) (apiv1.ImageRollout, error) {
	_, rollout, err := t.lockPointer(ctx, sku)
	if err != nil {
		return apiv1.ImageRollout{}, err
	}
	if rollout != nil {
		if _, err := t.tx.Exec(ctx, `UPDATE image_rollouts SET status = 'rolled_back', finished_at = now() WHERE id = $1`, *rollout); err != nil {
			return apiv1.ImageRollout{}, translate(err)
		}
		if _, err := t.tx.Exec(ctx, `UPDATE sku_image_pointers SET rollout_id = NULL, updated_at = now() WHERE sku = $1`, sku); err != nil {
			return apiv1.ImageRollout{}, translate(err)
		}
		return getRollout(ctx, t.tx, *rollout)
	}
	var id string
	err = t.tx.QueryRow(ctx, `SELECT r.id::text FROM image_rollouts r JOIN sku_image_pointers p ON p.sku = r.sku AND p.image_id = r.image_id
		WHERE r.sku = $1 AND r.status = 'promoted' AND r.previous_image_id IS NOT NULL
		ORDER BY r.finished_at DESC LIMIT 1`, sku).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return apiv1.ImageRollout{}, conflict("image_rollouts_one_canary", "nothing to roll back: no canary in progress and the default was not set by a promotion")
	}
	if err != nil {
		return apiv1.ImageRollout{}, translate(err)
	}
	// The trigger re-checks the previous image: a retired one cannot be the default again.
	if _, err := t.tx.Exec(ctx, `UPDATE sku_image_pointers p SET image_id = r.previous_image_id, updated_at = now()
		FROM image_rollouts r WHERE p.sku = $1 AND r.id = $2`, sku, id); err != nil {
		return apiv1.ImageRollout{}, translate(err)
	}
	if _, err := t.tx.Exec(ctx, `UPDATE image_rollouts SET status = 'rolled_back' WHERE id = $1`, id); err != nil {
		return apiv1.ImageRollout{}, translate(err)
	}
	return getRollout(ctx, t.tx, id)
}

const rolloutColumns = `r.id::text, r.sku, i.slug, coalesce(pi.slug, ''), r.share_percent, r.regions, r.status, r.started_at, r.finished_at
	FROM image_rollouts r JOIN os_images i ON i.id = r.image_id LEFT JOIN os_images pi ON pi.id = r.previous_image_id`

func scanRollout(row pgx.Row, r *apiv1.ImageRollout) error {
	return row.Scan(&r.ID, &r.SKU, &r.Image, &r.PreviousImage, &r.SharePercent, &r.Regions, &r.Status, &r.StartedAt, &r.FinishedAt)
}

func getRollout(ctx context.Context, q querier, id string) (apiv1.ImageRollout, error) {
	var r apiv1.ImageRollout
	return r, translate(scanRollout(q.QueryRow(ctx, `SELECT `+rolloutColumns+` WHERE r.id = $1`, id), &r))
}

// ImageRolloutStatus is SKU sku's pointer, canary, rollout history (newest first, at most
// 20) and how allocations fared on the canary and the default since the latest rollout
// started. ErrNotFound when there is no such SKU.
func (s *Store) ImageRolloutStatus(ctx context.Context, sku string) (apiv1.ImageRolloutStatus, error) {
	out := apiv1.ImageRolloutStatus{SKU: sku, Outcomes: []apiv1.ImageOutcome{}, History: []apiv1.ImageRollout{}}
	if _, err := getSKU(ctx, s.pool, sku, false); err != nil {
		return out, err
	}
	var rolloutID *string
	err := s.pool.QueryRow(ctx, `SELECT i.slug, p.rollout_id::text FROM sku_image_pointers p JOIN os_images i ON i.id = p.image_id
		WHERE p.sku = $1`, sku).Scan(&out.DefaultImage, &rolloutID)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return out, translate(err)
	}
	hist, err := queryAll(ctx, s.pool, scanRollout, `SELECT `+rolloutColumns+` WHERE r.sku = $1 ORDER BY r.started_at DESC LIMIT 20`, sku)
	if err != nil {
		return out, err
	}
	out.History = hist
	if len(hist) == 0 {
		return out, nil
	}
	latest := hist[0]
	if rolloutID != nil && *rolloutID == latest.ID {
		c := latest
		out.Canary = &c
	}
	out.Outcomes, err = queryAll(ctx, s.pool, func(row pgx.Row, o *apiv1.ImageOutcome) error {
		return row.Scan(&o.Image, &o.Allocations, &o.Active, &o.Failed, &o.TimeToReadyP50MS, &o.TimeToReadyMaxMS)
	}, `SELECT i.slug, count(*)::int, count(a.active_at)::int,
			count(*) FILTER (WHERE a.status = 'failed' AND a.active_at IS NULL)::int,
			(coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.active_at - a.created_at))
			          FILTER (WHERE a.active_at IS NOT NULL), 0) * 1000)::bigint,
			(coalesce(max(extract(epoch FROM a.active_at - a.created_at)), 0) * 1000)::bigint
		FROM allocations a JOIN os_images i ON i.id = a.os_image_id
		WHERE a.sku = $1 AND a.created_at >= $2 AND i.slug IN ($3, $4)
		GROUP BY i.slug ORDER BY i.slug`, sku, latest.StartedAt, latest.Image, latest.PreviousImage)
	return out, err
}
