package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The demand mix placement learns (migration 033): decayed request counts per SKU, region and
// GPU count, added by every replica's periodic flush, and admins' pinned mixes per SKU.

// DemandCount is a decayed request count: Requests as of AsOf.
type DemandCount struct {
	SKU, Region string
	GPUs        int
	Requests    float64
	AsOf        time.Time
}

// AddDemand adds counts (each Requests as of its AsOf, which the caller sets to when it
// flushes) to demand_requests in one statement: a stored row is decayed by the half-life to
// the later of the two times and the other side's count, decayed to it too, is added. Any
// number of replicas adding in any order end at the same decayed total.
func (s *Store) AddDemand(ctx context.Context, counts []DemandCount, halfLife time.Duration) error {
	if len(counts) == 0 {
		return nil
	}
	n := len(counts)
	skus, regions, gpus, reqs, asOf := make([]string, n), make([]string, n), make([]int32, n), make([]float64, n), make([]time.Time, n)
	for i, c := range counts {
		skus[i], regions[i], gpus[i], reqs[i], asOf[i] = c.SKU, c.Region, int32(c.GPUs), c.Requests, c.AsOf
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO demand_requests AS d (sku, region, gpus, requests, as_of)
		SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::double precision[], $5::timestamptz[])
		ON CONFLICT (sku, region, gpus) DO UPDATE SET
			requests = d.requests * demand_decay(extract(epoch FROM excluded.as_of - d.as_of)::double precision, $6)
				+ excluded.requests * demand_decay(extract(epoch FROM d.as_of - excluded.as_of)::double precision, $6),
			as_of = greatest(d.as_of, excluded.as_of)`,
		skus, regions, gpus, reqs, asOf, halfLife.Seconds())
	return translate(err)
}

// DemandCounts is every stored decayed count (a few rows per SKU and region).
func (s *Store) DemandCounts(ctx context.Context) ([]DemandCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT sku, region, gpus, requests, as_of FROM demand_requests`)
	if err != nil {
		return nil, translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DemandCount, error) {
		var c DemandCount
		err := r.Scan(&c.SKU, &c.Region, &c.GPUs, &c.Requests, &c.AsOf)
		return c, err
	})
	return out, translate(err)
}

// DemandPin is one GPU count of a SKU's pinned mix.
type DemandPin struct {
	SKU      string
	GPUs     int
	Weight   int
	PinnedBy string
	PinnedAt time.Time
}

// DemandPins is every pinned mix's entries, by SKU and GPU count.
func (s *Store) DemandPins(ctx context.Context) ([]DemandPin, error) {
	rows, err := s.pool.Query(ctx, `SELECT sku, gpus, weight, pinned_by, pinned_at FROM demand_mix_pins ORDER BY sku, gpus`)
	if err != nil {
		return nil, translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DemandPin, error) {
		var p DemandPin
		err := r.Scan(&p.SKU, &p.GPUs, &p.Weight, &p.PinnedBy, &p.PinnedAt)
		return p, err
	})
	return out, translate(err)
}

// PinDemandMix replaces SKU sku's pinned mix with weights (GPU count -> weight; empty: unpin)
// and records audit, in one transaction. ErrNotFound when there is no such SKU.
func (s *Store) PinDemandMix(ctx context.Context, sku string, weights map[int]int, by string, audit AuditRecord) error {
	return s.InTx(ctx, func(t *Tx) error {
		var one int
		// Locks the SKU row: concurrent pins of one SKU replace each other whole.
		if err := t.tx.QueryRow(ctx, `SELECT 1 FROM sku_catalog WHERE sku = $1 FOR UPDATE`, sku).Scan(&one); err != nil {
			return translate(err)
		}
		if _, err := t.tx.Exec(ctx, `DELETE FROM demand_mix_pins WHERE sku = $1`, sku); err != nil {
			return translate(err)
		}
		for g, w := range weights {
			if _, err := t.tx.Exec(ctx, `INSERT INTO demand_mix_pins (sku, gpus, weight, pinned_by) VALUES ($1, $2, $3, $4)`,
				sku, g, w, by); err != nil {
				return translate(err)
			}
		}
		return t.Audit(ctx, audit)
	})
}
