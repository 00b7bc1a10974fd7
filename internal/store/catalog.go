package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// The product catalog (sku_catalog) and the OS image catalog (os_images). Reads are on
// *Store and *Tx through one querier-based helper each; mutations are on *Tx only, so the
// caller writes the audit record in the same transaction. Validation of request shape lives
// at the API boundary; the schema re-checks enums, the digest format and the rule that an
// image without a digest is never active.

const skuColumns = `sku, vendor, display_name, accelerator_model, capacity_shape, gpus_total, allowed_gpu_counts,
	gpu_hourly_price_minor, currency, network_fabric, exclusive_node, resource_profile, active, created_at, updated_at, validation_policy,
	requires_signed_images, warm_slots`

func scanSKU(row pgx.Row, s *apiv1.SKU) error {
	var counts []int32
	err := row.Scan(&s.SKU, &s.Vendor, &s.DisplayName, &s.AcceleratorModel, &s.CapacityShape, &s.GPUsTotal, &counts,
		&s.GPUHourlyPriceMinor, &s.Currency, &s.NetworkFabric, &s.ExclusiveNode, rawJSON(&s.ResourceProfile), &s.Active,
		&s.CreatedAt, &s.UpdatedAt, &s.ValidationPolicy, &s.RequiresSignedImages, &s.WarmSlots)
	s.AllowedGPUCounts = make([]int, len(counts))
	for i, c := range counts {
		s.AllowedGPUCounts[i] = int(c)
	}
	return err
}

// ListSKUs returns SKUs by name; activeOnly hides switched-off products.
func (s *Store) ListSKUs(ctx context.Context, activeOnly bool) ([]apiv1.SKU, error) {
	return queryAll(ctx, s.pool, scanSKU, `SELECT `+skuColumns+` FROM sku_catalog WHERE active OR NOT $1 ORDER BY sku`, activeOnly)
}

// getSKU reads one SKU; lock takes the row FOR UPDATE (only meaningful inside a transaction).
func getSKU(ctx context.Context, q querier, sku string, lock bool) (apiv1.SKU, error) {
	var out apiv1.SKU
	sql := `SELECT ` + skuColumns + ` FROM sku_catalog WHERE sku = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	return out, translate(scanSKU(q.QueryRow(ctx, sql, sku), &out))
}

// GetSKU returns one SKU (ErrNotFound if there is none by that name).
func (s *Store) GetSKU(ctx context.Context, sku string) (apiv1.SKU, error) {
	return getSKU(ctx, s.pool, sku, false)
}

// GetSKU inside a transaction.
func (t *Tx) GetSKU(ctx context.Context, sku string) (apiv1.SKU, error) {
	return getSKU(ctx, t.tx, sku, false)
}

// CreateSKU adds a product (validated by the caller; the schema re-checks shape rules).
func (t *Tx) CreateSKU(ctx context.Context, in apiv1.SKU) (apiv1.SKU, error) {
	if in.Currency == "" {
		in.Currency = "USD"
	}
	if in.ValidationPolicy == "" {
		in.ValidationPolicy = "none"
	}
	_, err := t.tx.Exec(ctx, `INSERT INTO sku_catalog (sku, vendor, display_name, accelerator_model, capacity_shape, gpus_total,
			allowed_gpu_counts, gpu_hourly_price_minor, currency, network_fabric, exclusive_node, resource_profile, active, validation_policy,
			requires_signed_images)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15)`,
		in.SKU, in.Vendor, in.DisplayName, in.AcceleratorModel, in.CapacityShape, in.GPUsTotal, in.AllowedGPUCounts,
		in.GPUHourlyPriceMinor, in.Currency, in.NetworkFabric, in.CapacityShape == "baremetal", jsonObject(in.ResourceProfile), in.Active,
		in.ValidationPolicy, in.RequiresSignedImages)
	if err != nil {
		return apiv1.SKU{}, translate(err)
	}
	return getSKU(ctx, t.tx, in.SKU, false)
}

// PatchSKU updates the mutable SKU fields set in p (validated by the caller). The row is
// locked first, so concurrent patches apply one after the other.
func (t *Tx) PatchSKU(ctx context.Context, sku string, p apiv1.SKUPatch) (apiv1.SKU, error) {
	cur, err := getSKU(ctx, t.tx, sku, true)
	if err != nil {
		return cur, err
	}
	if p.DisplayName != nil {
		cur.DisplayName = *p.DisplayName
	}
	if p.AllowedGPUCounts != nil {
		cur.AllowedGPUCounts = p.AllowedGPUCounts
	}
	if p.GPUHourlyPriceMinor != nil {
		cur.GPUHourlyPriceMinor = *p.GPUHourlyPriceMinor
	}
	if p.ResourceProfile != nil {
		cur.ResourceProfile = *p.ResourceProfile
	}
	if p.Active != nil {
		cur.Active = *p.Active
	}
	if p.ValidationPolicy != nil {
		cur.ValidationPolicy = *p.ValidationPolicy
	}
	if p.RequiresSignedImages != nil {
		cur.RequiresSignedImages = *p.RequiresSignedImages
	}
	if p.WarmSlots != nil {
		cur.WarmSlots = *p.WarmSlots
	}
	_, err = t.tx.Exec(ctx, `UPDATE sku_catalog SET display_name = $2, allowed_gpu_counts = $3, gpu_hourly_price_minor = $4,
		resource_profile = $5, active = $6, validation_policy = $7, requires_signed_images = $8, warm_slots = $9, updated_at = now() WHERE sku = $1`,
		sku, cur.DisplayName, cur.AllowedGPUCounts, cur.GPUHourlyPriceMinor, jsonObject(cur.ResourceProfile), cur.Active, cur.ValidationPolicy,
		cur.RequiresSignedImages, cur.WarmSlots)
	if err != nil {
		return cur, translate(err)
	}
	return getSKU(ctx, t.tx, sku, false)
}

const imageColumns = `id::text, slug, display_name, version, target, family, architecture, coalesce(accelerator_vendor, ''),
	coalesce(network_fabric, ''), image_format, source_type, source_ref, coalesce(digest_sha256, ''), size_bytes,
	cloud_init_supported, guest_agent_supported, default_username, driver_strategy, compatibility_metadata,
	is_default, active, created_at, updated_at, retired_at, signature`

func scanImage(row pgx.Row, i *apiv1.OSImage) error {
	return row.Scan(&i.ID, &i.Slug, &i.DisplayName, &i.Version, &i.Target, &i.Family, &i.Architecture, &i.AcceleratorVendor,
		&i.NetworkFabric, &i.ImageFormat, &i.SourceType, &i.SourceRef, &i.DigestSHA256, &i.SizeBytes,
		&i.CloudInitSupported, &i.GuestAgentSupported, &i.DefaultUsername, &i.DriverStrategy, &i.CompatibilityMetadata,
		&i.IsDefault, &i.Active, &i.CreatedAt, &i.UpdatedAt, &i.RetiredAt, &i.Signature)
}

// ImageFilter narrows ListImages; zero values do not filter. AcceleratorVendor and
// NetworkFabric match the column exactly ("any" lists images declared for any vendor/fabric).
type ImageFilter struct {
	Target            string
	Active            *bool
	Family            string
	AcceleratorVendor string
	NetworkFabric     string
}

// ListImages returns images ordered by slug.
func (s *Store) ListImages(ctx context.Context, f ImageFilter) ([]apiv1.OSImage, error) {
	return queryAll(ctx, s.pool, scanImage, `SELECT `+imageColumns+` FROM os_images
		WHERE ($1 = '' OR target = $1) AND ($2 = '' OR family = $2) AND ($3::bool IS NULL OR active = $3)
		  AND ($4 = '' OR accelerator_vendor = $4) AND ($5 = '' OR network_fabric = $5)
		ORDER BY slug`, f.Target, f.Family, f.Active, f.AcceleratorVendor, f.NetworkFabric)
}

// imageWhere is the predicate finding an image by id or slug ($1): a UUID-shaped key is looked
// up by primary key, anything else by slug, so both paths use an index. The API refuses
// UUID-shaped slugs, so the two never collide.
func imageWhere(idOrSlug string) string {
	if IsUUID(idOrSlug) {
		return `id = $1::uuid`
	}
	return `slug = $1`
}

func getImage(ctx context.Context, q querier, idOrSlug string, lock bool) (apiv1.OSImage, error) {
	var out apiv1.OSImage
	sql := `SELECT ` + imageColumns + ` FROM os_images WHERE ` + imageWhere(idOrSlug)
	if lock {
		sql += ` FOR UPDATE`
	}
	return out, translate(scanImage(q.QueryRow(ctx, sql, idOrSlug), &out))
}

// GetImage finds an image by id (UUID) or slug.
func (s *Store) GetImage(ctx context.Context, idOrSlug string) (apiv1.OSImage, error) {
	return getImage(ctx, s.pool, idOrSlug, false)
}

// GetImage inside a transaction.
func (t *Tx) GetImage(ctx context.Context, idOrSlug string) (apiv1.OSImage, error) {
	return getImage(ctx, t.tx, idOrSlug, false)
}

// jsonObject stores an absent or null JSON document as the empty object.
func jsonObject(raw json.RawMessage) []byte {
	if len(raw) == 0 || string(raw) == "null" {
		return []byte("{}")
	}
	return raw
}

// CreateImage inserts an image (validated by the caller; the schema re-checks enums and digest).
// IsDefault makes it the one default image of its target.
func (t *Tx) CreateImage(ctx context.Context, im apiv1.OSImage) (apiv1.OSImage, error) {
	if im.IsDefault {
		if err := t.lockDefaults(ctx, im.Target); err != nil {
			return apiv1.OSImage{}, err
		}
	}
	var id string
	err := t.tx.QueryRow(ctx, `INSERT INTO os_images (slug, display_name, version, target, family, architecture,
			accelerator_vendor, network_fabric, image_format, source_type, source_ref, digest_sha256, size_bytes,
			cloud_init_supported, guest_agent_supported, default_username, driver_strategy, compatibility_metadata, active, signature)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20) RETURNING id::text`,
		im.Slug, im.DisplayName, im.Version, im.Target, im.Family, im.Architecture, nullIfEmpty(im.AcceleratorVendor),
		nullIfEmpty(im.NetworkFabric), im.ImageFormat, im.SourceType, im.SourceRef, nullIfEmpty(im.DigestSHA256),
		im.SizeBytes, im.CloudInitSupported, im.GuestAgentSupported, im.DefaultUsername, im.DriverStrategy,
		jsonObject(im.CompatibilityMetadata), im.Active, im.Signature).Scan(&id)
	if err != nil {
		return apiv1.OSImage{}, translate(err)
	}
	if im.IsDefault {
		if err := t.setDefaultImage(ctx, id, im.Target); err != nil {
			return apiv1.OSImage{}, err
		}
	}
	return getImage(ctx, t.tx, id, false)
}

// lockDefaults takes the transaction-scoped advisory lock that serializes default-image changes
// of one target. Without it two transactions marking different images could each miss the
// other's uncommitted marker and leave two defaults. Take it before locking any os_images row:
// a holder updates the previous default's row, so waiting for it while holding a row lock
// could deadlock.
func (t *Tx) lockDefaults(ctx context.Context, target string) error {
	_, err := t.tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('gpuaas.os_images.default'), hashtext($1))`, target)
	return translate(err)
}

// setDefaultImage makes image id the only is_default image of its target.
func (t *Tx) setDefaultImage(ctx context.Context, id, target string) error {
	if err := t.lockDefaults(ctx, target); err != nil { // re-entrant if already held
		return err
	}
	// A fresh statement after the lock: it sees defaults committed by whoever held it before.
	_, err := t.tx.Exec(ctx, `UPDATE os_images SET is_default = (id = $1), updated_at = now()
		WHERE target = $2 AND (is_default OR id = $1)`, id, target)
	return translate(err)
}

// PatchImage updates the mutable image fields set in p. Activating an image clears retired_at;
// the schema refuses to activate one without a digest (ErrInvalid).
func (t *Tx) PatchImage(ctx context.Context, idOrSlug string, p apiv1.OSImagePatch) (apiv1.OSImage, error) {
	if p.IsDefault != nil && *p.IsDefault {
		// target is immutable, so an unlocked read names the right lock.
		pre, err := getImage(ctx, t.tx, idOrSlug, false)
		if err != nil {
			return pre, err
		}
		if err := t.lockDefaults(ctx, pre.Target); err != nil {
			return pre, err
		}
	}
	cur, err := getImage(ctx, t.tx, idOrSlug, true)
	if err != nil {
		return cur, err
	}
	if p.DisplayName != nil {
		cur.DisplayName = *p.DisplayName
	}
	if p.SourceRef != nil {
		cur.SourceRef = *p.SourceRef
	}
	oldDigest := cur.DigestSHA256
	if p.DigestSHA256 != nil {
		cur.DigestSHA256 = *p.DigestSHA256
	}
	if p.SizeBytes != nil {
		cur.SizeBytes = p.SizeBytes
	}
	if p.CompatibilityMetadata != nil {
		cur.CompatibilityMetadata = *p.CompatibilityMetadata
	}
	if p.Active != nil {
		cur.Active = *p.Active
	}
	if p.Signature != nil {
		cur.Signature = *p.Signature
	} else if cur.DigestSHA256 != oldDigest {
		cur.Signature = "" // a signature covers one digest: a new digest needs a new signature
	}
	_, err = t.tx.Exec(ctx, `UPDATE os_images SET display_name = $2, source_ref = $3, digest_sha256 = $4, size_bytes = $5,
		compatibility_metadata = $6, active = $7, retired_at = CASE WHEN $7 THEN NULL ELSE retired_at END, signature = $8,
		updated_at = now()
		WHERE id = $1`, cur.ID, cur.DisplayName, cur.SourceRef, nullIfEmpty(cur.DigestSHA256), cur.SizeBytes,
		jsonObject(cur.CompatibilityMetadata), cur.Active, cur.Signature)
	if err != nil {
		return cur, translate(err)
	}
	if p.IsDefault != nil {
		if *p.IsDefault {
			err = t.setDefaultImage(ctx, cur.ID, cur.Target)
		} else {
			_, err = t.tx.Exec(ctx, `UPDATE os_images SET is_default = false, updated_at = now() WHERE id = $1 AND is_default`, cur.ID)
			err = translate(err)
		}
		if err != nil {
			return cur, err
		}
	}
	return getImage(ctx, t.tx, cur.ID, false)
}

// RetireImage deactivates an image and drops its default marker: active=false and retired_at
// set on the first call only, so retiring twice is a no-op. Running allocations keep their
// image snapshot. ErrNotFound when there is no such image.
func (t *Tx) RetireImage(ctx context.Context, idOrSlug string) error {
	tag, err := t.tx.Exec(ctx, `UPDATE os_images SET active = false, is_default = false,
		retired_at = coalesce(retired_at, now()),
		updated_at = CASE WHEN retired_at IS NULL OR active OR is_default THEN now() ELSE updated_at END
		WHERE `+imageWhere(idOrSlug), idOrSlug)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// HardDeleteImage deletes an image no allocation ever referenced; otherwise it fails with an
// error wrapping ErrConflict that says how many allocations reference it (retire it instead).
// The row lock taken first conflicts with the key-share lock an inserting allocation takes on
// the referenced image, so a concurrent reference either is counted or fails its foreign key.
func (t *Tx) HardDeleteImage(ctx context.Context, idOrSlug string) error {
	cur, err := getImage(ctx, t.tx, idOrSlug, true)
	if err != nil {
		return err
	}
	var refs int
	if err := t.tx.QueryRow(ctx, `SELECT count(*) FROM allocations WHERE os_image_id = $1`, cur.ID).Scan(&refs); err != nil {
		return translate(err)
	}
	if refs > 0 {
		noun := "allocations"
		if refs == 1 {
			noun = "allocation"
		}
		return &DBError{Kind: ErrConflict, Constraint: "allocations_os_image_id_fkey",
			Detail: fmt.Sprintf("image %s is referenced by %d %s; retire it instead", cur.Slug, refs, noun)}
	}
	_, err = t.tx.Exec(ctx, `DELETE FROM os_images WHERE id = $1`, cur.ID)
	return translate(err)
}
