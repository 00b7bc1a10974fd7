package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// ResolvedImage is the image a slice allocation will boot.
type ResolvedImage struct {
	ID           string `json:"id"`
	Slug         string `json:"slug"`
	SourceType   string `json:"source_type"`
	SourceRef    string `json:"source_ref"`
	DigestSHA256 string `json:"digest_sha256"`
	ImageFormat  string `json:"image_format"`
	Username     string `json:"default_username"`
}

// viableImage is the seed-000 "viable os_images row" predicate for a vm_slice SKU: active,
// not retired, with a digest, and either generic or listing the SKU as compatible.
const viableImage = `i.target = 'vm_slice' AND i.active AND i.retired_at IS NULL AND i.digest_sha256 IS NOT NULL
	AND (NOT (i.compatibility_metadata ? 'compatible_skus')
	     OR i.compatibility_metadata->'compatible_skus' ? $1)`

// ResolveSliceImage picks the image for a slice allocation: the named slug if given (it must
// be viable for the SKU), else the best default: SKU-specific images before generic ones,
// then the is_default marker, then the newest. ErrNotFound when none is viable.
func (t *Tx) ResolveSliceImage(ctx context.Context, sku, slug string) (ResolvedImage, error) {
	return resolveSliceImage(ctx, t.tx, sku, slug)
}

// ResolveSliceImage outside a transaction.
func (s *Store) ResolveSliceImage(ctx context.Context, sku, slug string) (ResolvedImage, error) {
	return resolveSliceImage(ctx, s.pool, sku, slug)
}

// resolveImageSQL picks the slice image for $1 (SKU) and $2 (slug, "" for the default).
const resolveImageSQL = `SELECT i.id::text, i.slug, i.source_type, i.source_ref, i.digest_sha256, i.image_format, i.default_username
	FROM os_images i
	WHERE ` + viableImage + ` AND ($2 = '' OR i.slug = $2)
	ORDER BY coalesce(i.compatibility_metadata->'compatible_skus' ? $1, false) DESC, i.is_default DESC, i.created_at DESC
	LIMIT 1`

func resolveSliceImage(ctx context.Context, q querier, sku, slug string) (ResolvedImage, error) {
	return scanResolvedImage(q.QueryRow(ctx, resolveImageSQL, sku, slug))
}

func scanResolvedImage(row pgx.Row) (ResolvedImage, error) {
	var r ResolvedImage
	err := row.Scan(&r.ID, &r.Slug, &r.SourceType, &r.SourceRef, &r.DigestSHA256, &r.ImageFormat, &r.Username)
	if errors.Is(translate(err), ErrNotFound) {
		return r, ErrNotFound
	}
	return r, translate(err)
}

// SKUWithSliceImage reads a SKU (GetSKU) and resolves its slice image (ResolveSliceImage) in
// one round trip. imgErr is the image lookup's own outcome (ErrNotFound when none fits) and
// means something only for a gpu_slice SKU; err is the SKU's (ErrNotFound) or the batch's.
func (t *Tx) SKUWithSliceImage(ctx context.Context, sku, slug string) (out apiv1.SKU, img ResolvedImage, imgErr, err error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT `+skuColumns+` FROM sku_catalog WHERE sku = $1`, sku)
	b.Queue(resolveImageSQL, sku, slug)
	br := t.tx.SendBatch(ctx, b)
	defer br.Close()
	if err := translate(scanSKU(br.QueryRow(), &out)); err != nil {
		return out, img, nil, err
	}
	img, imgErr = scanResolvedImage(br.QueryRow())
	return out, img, imgErr, translate(br.Close())
}
