package store

import (
	"context"
	"errors"
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

func resolveSliceImage(ctx context.Context, q querier, sku, slug string) (ResolvedImage, error) {
	var r ResolvedImage
	err := q.QueryRow(ctx, `SELECT i.id::text, i.slug, i.source_type, i.source_ref, i.digest_sha256, i.image_format, i.default_username
		FROM os_images i
		WHERE `+viableImage+` AND ($2 = '' OR i.slug = $2)
		ORDER BY coalesce(i.compatibility_metadata->'compatible_skus' ? $1, false) DESC, i.is_default DESC, i.created_at DESC
		LIMIT 1`, sku, slug).Scan(&r.ID, &r.Slug, &r.SourceType, &r.SourceRef, &r.DigestSHA256, &r.ImageFormat, &r.Username)
	if errors.Is(translate(err), ErrNotFound) {
		return r, ErrNotFound
	}
	return r, translate(err)
}
