package store

import (
	"context"
	"errors"
	"time"

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
	// Signature is the publisher's signature over the digest ("" when unsigned), and
	// SignatureRequired whether the SKU requires signed images: the host then verifies it.
	Signature         string `json:"signature,omitempty"`
	SignatureRequired bool   `json:"signature_required,omitempty"`
}

// viableImage is the seed-000 "viable os_images row" predicate for a vm_slice SKU: active,
// not retired, with a digest, either generic or listing the SKU as compatible, and signed
// when the SKU requires signed images.
const viableImage = `i.target = 'vm_slice' AND i.active AND i.retired_at IS NULL AND i.digest_sha256 IS NOT NULL
	AND (NOT (i.compatibility_metadata ? 'compatible_skus')
	     OR i.compatibility_metadata->'compatible_skus' ? $1)
	AND (i.signature <> '' OR NOT ` + skuRequiresSigned + `)`

// skuRequiresSigned is whether SKU $1 requires signed images.
const skuRequiresSigned = `EXISTS (SELECT 1 FROM sku_catalog s WHERE s.sku = $1 AND s.requires_signed_images)`

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

// resolveImageSQL picks the slice image for $1 (SKU) and $2 (slug, "" for the default): the
// SKU's default pointer when it has one (migration 024), else the best viable image.
const resolveImageSQL = `SELECT i.id::text, i.slug, i.source_type, i.source_ref, i.digest_sha256, i.image_format, i.default_username,
		i.signature, ` + skuRequiresSigned + `
	FROM os_images i
	WHERE ` + viableImage + ` AND ($2 = '' OR i.slug = $2)
	  AND ($2 <> '' OR NOT EXISTS (SELECT 1 FROM sku_image_pointers p WHERE p.sku = $1)
	       OR i.id = (SELECT p.image_id FROM sku_image_pointers p WHERE p.sku = $1))
	ORDER BY coalesce(i.compatibility_metadata->'compatible_skus' ? $1, false) DESC, i.is_default DESC, i.created_at DESC
	LIMIT 1`

func resolveSliceImage(ctx context.Context, q querier, sku, slug string) (ResolvedImage, error) {
	return scanResolvedImage(q.QueryRow(ctx, resolveImageSQL, sku, slug))
}

func scanResolvedImage(row pgx.Row) (ResolvedImage, error) {
	var r ResolvedImage
	err := row.Scan(&r.ID, &r.Slug, &r.SourceType, &r.SourceRef, &r.DigestSHA256, &r.ImageFormat, &r.Username,
		&r.Signature, &r.SignatureRequired)
	if errors.Is(translate(err), ErrNotFound) {
		return r, ErrNotFound
	}
	return r, translate(err)
}

// CreateLookup is what SKUWithSliceImage read.
type CreateLookup struct {
	SKU apiv1.SKU
	// Image is the slice image resolved; ImageErr that lookup's own outcome (ErrNotFound when
	// none fits), meaningful only for a gpu_slice SKU.
	Image    ResolvedImage
	ImageErr error
	// Canary is the SKU's canary rollout in progress (nil when none, or when the request
	// named its image): nodes it includes boot its image instead of Image.
	Canary *Canary
	// Window is the first placement window when one was asked for (nil otherwise), WindowFor
	// what was asked and WindowErr its outcome.
	Window    *Window
	WindowFor WindowRequest
	WindowErr error
}

// SKUWithSliceImage reads a SKU (GetSKU) and resolves its slice image (ResolveSliceImage) in
// one round trip, with, when first is not nil, the first placement window (SliceWindow): a
// create's placement arguments come from the request, not the SKU row, so its first window
// is read before the SKU is checked, and discarded if the request turns out invalid or not
// for a slice. err is the SKU's (ErrNotFound) or the batch's.
func (t *Tx) SKUWithSliceImage(ctx context.Context, sku, slug string, first *WindowRequest) (CreateLookup, error) {
	var out CreateLookup
	b := &pgx.Batch{}
	b.Queue(`SELECT `+skuColumns+` FROM sku_catalog WHERE sku = $1`, sku)
	b.Queue(resolveImageSQL, sku, slug)
	b.Queue(canarySQL, sku, slug)
	if first != nil {
		first.queue(b)
	}
	sent := time.Now()
	br := t.tx.SendBatch(ctx, b)
	defer br.Close()
	if err := translate(scanSKU(br.QueryRow(), &out.SKU)); err != nil {
		return out, err
	}
	out.Image, out.ImageErr = scanResolvedImage(br.QueryRow())
	canary, err := scanCanary(br.QueryRow())
	if err != nil {
		return out, err
	}
	out.Canary = canary
	if first != nil {
		w, err := first.read(br)
		w.SentAt = sent
		out.Window, out.WindowFor, out.WindowErr = &w, *first, err
	}
	return out, translate(br.Close())
}
