package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

const skuColumns = `sku, vendor, display_name, accelerator_model, capacity_shape, gpus_total, allowed_gpu_counts,
	gpu_hourly_price_minor, currency, network_fabric, exclusive_node, resource_profile, active, created_at, updated_at`

func scanSKU(row pgx.Row, s *apiv1.SKU) error {
	var counts []int32
	err := row.Scan(&s.SKU, &s.Vendor, &s.DisplayName, &s.AcceleratorModel, &s.CapacityShape, &s.GPUsTotal, &counts,
		&s.GPUHourlyPriceMinor, &s.Currency, &s.NetworkFabric, &s.ExclusiveNode, &s.ResourceProfile, &s.Active,
		&s.CreatedAt, &s.UpdatedAt)
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

func getSKU(ctx context.Context, q querier, sku string, lock bool) (apiv1.SKU, error) {
	var out apiv1.SKU
	sql := `SELECT ` + skuColumns + ` FROM sku_catalog WHERE sku = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	return out, translate(scanSKU(q.QueryRow(ctx, sql, sku), &out))
}

// GetSKU returns one SKU.
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
	_, err := t.tx.Exec(ctx, `INSERT INTO sku_catalog (sku, vendor, display_name, accelerator_model, capacity_shape, gpus_total,
			allowed_gpu_counts, gpu_hourly_price_minor, currency, network_fabric, exclusive_node, resource_profile, active)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)`,
		in.SKU, in.Vendor, in.DisplayName, in.AcceleratorModel, in.CapacityShape, in.GPUsTotal, in.AllowedGPUCounts,
		in.GPUHourlyPriceMinor, in.Currency, in.NetworkFabric, in.CapacityShape == "baremetal", jsonObject(in.ResourceProfile), in.Active)
	if err != nil {
		return apiv1.SKU{}, translate(err)
	}
	return getSKU(ctx, t.tx, in.SKU, false)
}

// PatchSKU updates mutable SKU fields (validated by the caller).
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
	_, err = t.tx.Exec(ctx, `UPDATE sku_catalog SET display_name = $2, allowed_gpu_counts = $3, gpu_hourly_price_minor = $4,
		resource_profile = $5, active = $6, updated_at = now() WHERE sku = $1`,
		sku, cur.DisplayName, cur.AllowedGPUCounts, cur.GPUHourlyPriceMinor, []byte(cur.ResourceProfile), cur.Active)
	if err != nil {
		return cur, translate(err)
	}
	return getSKU(ctx, t.tx, sku, false)
}

const imageColumns = `id::text, slug, display_name, version, target, family, architecture, coalesce(accelerator_vendor, ''),
	coalesce(network_fabric, ''), image_format, source_type, source_ref, coalesce(digest_sha256, ''), size_bytes,
	cloud_init_supported, guest_agent_supported, default_username, driver_strategy, compatibility_metadata,
	is_default, active, created_at, updated_at, retired_at`

func scanImage(row pgx.Row, i *apiv1.OSImage) error {
	return row.Scan(&i.ID, &i.Slug, &i.DisplayName, &i.Version, &i.Target, &i.Family, &i.Architecture, &i.AcceleratorVendor,
		&i.NetworkFabric, &i.ImageFormat, &i.SourceType, &i.SourceRef, &i.DigestSHA256, &i.SizeBytes,
		&i.CloudInitSupported, &i.GuestAgentSupported, &i.DefaultUsername, &i.DriverStrategy, &i.CompatibilityMetadata,
		&i.IsDefault, &i.Active, &i.CreatedAt, &i.UpdatedAt, &i.RetiredAt)
}

// ImageFilter narrows ListImages.
type ImageFilter struct {
	Target string
	Family string
	Active *bool
}

// ListImages returns images by slug.
func (s *Store) ListImages(ctx context.Context, f ImageFilter) ([]apiv1.OSImage, error) {
	return queryAll(ctx, s.pool, scanImage, `SELECT `+imageColumns+` FROM os_images
		WHERE ($1 = '' OR target = $1) AND ($2 = '' OR family = $2) AND ($3::bool IS NULL OR active = $3)
		ORDER BY slug`, f.Target, f.Family, f.Active)
}

func getImage(ctx context.Context, q querier, idOrSlug string, lock bool) (apiv1.OSImage, error) {
	var out apiv1.OSImage
	sql := `SELECT ` + imageColumns + ` FROM os_images WHERE slug = $1 OR id::text = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	return out, translate(scanImage(q.QueryRow(ctx, sql, idOrSlug), &out))
}

// GetImage finds an image by id or slug.
func (s *Store) GetImage(ctx context.Context, idOrSlug string) (apiv1.OSImage, error) {
	return getImage(ctx, s.pool, idOrSlug, false)
}

func jsonObject(raw json.RawMessage) []byte {
	if len(raw) == 0 || string(raw) == "null" {
		return []byte("{}")
	}
	return raw
}

// CreateImage inserts an image (validated by the caller; the schema re-checks enums and digest).
func (t *Tx) CreateImage(ctx context.Context, im apiv1.OSImage) (apiv1.OSImage, error) {
	var id string
	err := t.tx.QueryRow(ctx, `INSERT INTO os_images (slug, display_name, version, target, family, architecture,
			accelerator_vendor, network_fabric, image_format, source_type, source_ref, digest_sha256, size_bytes,
			cloud_init_supported, guest_agent_supported, default_username, driver_strategy, compatibility_metadata, active)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19) RETURNING id::text`,
		im.Slug, im.DisplayName, im.Version, im.Target, im.Family, im.Architecture, nullIfEmpty(im.AcceleratorVendor),
		nullIfEmpty(im.NetworkFabric), im.ImageFormat, im.SourceType, im.SourceRef, nullIfEmpty(im.DigestSHA256),
		im.SizeBytes, im.CloudInitSupported, im.GuestAgentSupported, im.DefaultUsername, im.DriverStrategy,
		jsonObject(im.CompatibilityMetadata), im.Active).Scan(&id)
	if err != nil {
		return apiv1.OSImage{}, translate(err)
	}
	if im.IsDefault {
		if err := t.setDefaultImage(ctx, id); err != nil {
			return apiv1.OSImage{}, err
		}
	}
	return getImage(ctx, t.tx, id, false)
}

func (t *Tx) setDefaultImage(ctx context.Context, id string) error {
	_, err := t.tx.Exec(ctx, `UPDATE os_images SET is_default = (id = $1), updated_at = now()
		WHERE target = (SELECT target FROM os_images WHERE id = $1) AND (is_default OR id = $1)`, id)
	return translate(err)
}

// PatchImage updates mutable image fields.
func (t *Tx) PatchImage(ctx context.Context, idOrSlug string, p apiv1.OSImagePatch) (apiv1.OSImage, error) {
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
		if cur.Active {
			cur.RetiredAt = nil
		}
	}
	_, err = t.tx.Exec(ctx, `UPDATE os_images SET display_name = $2, source_ref = $3, digest_sha256 = $4, size_bytes = $5,
		compatibility_metadata = $6, active = $7, retired_at = CASE WHEN $7 THEN NULL ELSE retired_at END, updated_at = now()
		WHERE id = $1`, cur.ID, cur.DisplayName, cur.SourceRef, nullIfEmpty(cur.DigestSHA256), cur.SizeBytes,
		jsonObject(cur.CompatibilityMetadata), cur.Active)
	if err != nil {
		return cur, translate(err)
	}
	if p.IsDefault != nil {
		if *p.IsDefault {
			err = t.setDefaultImage(ctx, cur.ID)
		} else {
			_, err = t.tx.Exec(ctx, `UPDATE os_images SET is_default = false WHERE id = $1`, cur.ID)
		}
		if err != nil {
			return cur, translate(err)
		}
	}
	return getImage(ctx, t.tx, cur.ID, false)
}

// RetireImage deactivates an image (idempotent). Running allocations keep their snapshot.
func (t *Tx) RetireImage(ctx context.Context, idOrSlug string) error {
	tag, err := t.tx.Exec(ctx, `UPDATE os_images SET active = false, is_default = false,
		retired_at = coalesce(retired_at, now()), updated_at = now() WHERE slug = $1 OR id::text = $1`, idOrSlug)
	if err != nil {
		return translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// HardDeleteImage deletes an image that no allocation ever referenced.
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
		return &DBError{Kind: ErrConflict, Detail: fmt.Sprintf("image %s is referenced by %d allocations; retire it instead", cur.Slug, refs)}
	}
	_, err = t.tx.Exec(ctx, `DELETE FROM os_images WHERE id = $1`, cur.ID)
	return translate(err)
}

// GetImage inside a transaction.
func (t *Tx) GetImage(ctx context.Context, idOrSlug string) (apiv1.OSImage, error) {
	return getImage(ctx, t.tx, idOrSlug, false)
}
