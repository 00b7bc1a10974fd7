package store

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// FleetStats is what the controller's /metrics reports about the fleet and the work in flight,
// read from the database at scrape time. Alerting rules (deploy/prometheus) are written
// against these figures; they are the same from every replica.
type FleetStats struct {
	Nodes            map[string]int // by status
	NodesStale       int            // active nodes heard from once whose last heartbeat is older than the threshold
	Slots            map[string]int // by status
	Allocations      map[string]int // live allocations by status (released and failed are not counted)
	OldestInFlight   time.Duration  // age of the oldest requested/provisioning allocation (0: none)
	RecentProvision  []float64      // seconds from create to active of allocations created in the recent window
	TasksPending     map[string]int // queued and leased tasks
	OldestPending    time.Duration  // age of the oldest queued/leased task (0: none)
	TasksFailed      map[[2]string]int
	WipeFailures     int       // unverified wipe proofs among the last WipeProofWindow recorded in the window
	NodeCertEarliest time.Time // earliest expiry of an active node's newest unrevoked certificate (zero: none)
	SKUs             map[string]SKUCapacity
}

// SKUCapacity is a SKU's GPUs on sellable nodes (active, not draining, not simulated unless
// allowed): all of them, and those free now.
type SKUCapacity struct{ Total, Free int }

// StatsWindow is how far back the "recent" figures look (failed tasks, wipe failures,
// provisioning times).
const StatsWindow = 15 * time.Minute

// WipeProofWindow bounds how many of the newest wipe proofs a scrape reads, so a long history
// does not turn every scrape into a table scan.
const WipeProofWindow = 10000

// v7Floor is the smallest UUIDv7 of time t: ids created at or after t sort at or above it
// (migration 010), so "created since t" is a range over the primary key.
func v7Floor(t time.Time) string {
	var u uuid.UUID
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(u[:6], ms[2:])
	u[6] = 0x70
	u[8] = 0x80
	return u.String()
}

// FleetStats reads the figures above in one snapshot. staleAfter is the heartbeat age past
// which an active node counts as missing. Each query is bounded by an index (live-status
// partial indexes, time-ordered ids) or by the size of the fleet, never by the history.
func (s *Store) FleetStats(ctx context.Context, staleAfter time.Duration) (FleetStats, error) {
	st := FleetStats{Nodes: map[string]int{}, Slots: map[string]int{}, Allocations: map[string]int{},
		TasksPending: map[string]int{}, TasksFailed: map[[2]string]int{}, SKUs: map[string]SKUCapacity{}}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return st, translate(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	now := time.Now()
	since := v7Floor(now.Add(-StatsWindow))
	// Tasks finish within the provisioning deadline (20 minutes by default) of their creation;
	// an hour of ids covers every task that can have finished in the window.
	tasksSince := v7Floor(now.Add(-time.Hour))

	counts := func(sql string, into map[string]int, args ...any) error {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			var n int
			if err := rows.Scan(&k, &n); err != nil {
				return err
			}
			into[k] = n
		}
		return rows.Err()
	}
	if err := counts(`SELECT status, count(*)::int FROM nodes GROUP BY status`, st.Nodes); err != nil {
		return st, translate(err)
	}
	if err := counts(`SELECT status, count(*)::int FROM node_resource_slots GROUP BY status`, st.Slots); err != nil {
		return st, translate(err)
	}
	if err := counts(`SELECT status, count(*)::int FROM allocations WHERE status NOT IN ('released', 'failed') GROUP BY status`, st.Allocations); err != nil {
		return st, translate(err)
	}
	if err := counts(`SELECT status, count(*)::int FROM node_tasks WHERE status IN ('queued', 'leased') GROUP BY status`, st.TasksPending); err != nil {
		return st, translate(err)
	}
	var oldestAlloc, oldestTask, stale float64
	if err := tx.QueryRow(ctx, `SELECT
		coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM allocations
		          WHERE status IN ('requested', 'provisioning')), 0)::float8,
		coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM node_tasks
		          WHERE status IN ('queued', 'leased')), 0)::float8,
		(SELECT count(*) FROM nodes WHERE status = 'active'
		   AND last_heartbeat_at < now() - make_interval(secs => $1))::float8,
		coalesce((SELECT count(*) FROM (SELECT verified, recorded_at FROM slot_wipe_proofs ORDER BY id DESC LIMIT $2) p
		          WHERE NOT p.verified AND p.recorded_at > now() - make_interval(secs => $3)), 0)::int`,
		staleAfter.Seconds(), WipeProofWindow, StatsWindow.Seconds()).Scan(&oldestAlloc, &oldestTask, &stale, &st.WipeFailures); err != nil {
		return st, translate(err)
	}
	st.OldestInFlight = time.Duration(oldestAlloc * float64(time.Second))
	st.OldestPending = time.Duration(oldestTask * float64(time.Second))
	st.NodesStale = int(stale)

	rows, err := tx.Query(ctx, `SELECT type, status, count(*)::int FROM node_tasks
		WHERE id >= $1::uuid AND status IN ('failed', 'refused', 'expired')
		  AND completed_at > now() - make_interval(secs => $2)
		GROUP BY type, status`, tasksSince, StatsWindow.Seconds())
	if err != nil {
		return st, translate(err)
	}
	for rows.Next() {
		var typ, status string
		var n int
		if err := rows.Scan(&typ, &status, &n); err != nil {
			rows.Close()
			return st, translate(err)
		}
		st.TasksFailed[[2]string{typ, status}] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, translate(err)
	}

	rows, err = tx.Query(ctx, `SELECT extract(epoch FROM active_at - created_at)::float8 FROM allocations
		WHERE id >= $1::uuid AND active_at IS NOT NULL`, since)
	if err != nil {
		return st, translate(err)
	}
	for rows.Next() {
		var sec float64
		if err := rows.Scan(&sec); err != nil {
			rows.Close()
			return st, translate(err)
		}
		st.RecentProvision = append(st.RecentProvision, sec)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, translate(err)
	}

	var earliest *time.Time
	if err := tx.QueryRow(ctx, `SELECT min(newest) FROM (
		SELECT max(c.not_after) AS newest FROM node_credentials c JOIN nodes n ON n.id = c.node_id
		WHERE n.status = 'active' AND c.revoked_at IS NULL GROUP BY c.node_id) x`).Scan(&earliest); err != nil {
		return st, translate(err)
	}
	if earliest != nil {
		st.NodeCertEarliest = *earliest
	}

	// Sellable capacity per SKU: slice SKUs count their slots' GPUs, baremetal SKUs the
	// node's whole GPUs while it holds no live claim.
	rows, err = tx.Query(ctx, `
		SELECT n.slice_sku, sum(s.gpu_count)::int,
		       coalesce(sum(s.gpu_count) FILTER (WHERE s.status = 'available'), 0)::int
		FROM nodes n JOIN node_resource_slots s ON s.node_id = n.id
		WHERE n.slice_sku IS NOT NULL AND n.status = 'active' AND NOT n.draining
		  AND (NOT n.simulated OR current_setting('`+AllowSimulatedParam+`', true) = 'on')
		  AND s.status <> 'disabled'
		GROUP BY n.slice_sku
		UNION ALL
		SELECT n.sku, sum(k.gpus_total)::int,
		       coalesce(sum(k.gpus_total) FILTER (WHERE NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
		           WHERE c.node_id = n.id AND c.status IN `+liveClaim+`)), 0)::int
		FROM nodes n JOIN sku_catalog k ON k.sku = n.sku
		WHERE n.status = 'active' AND NOT n.draining
		  AND (NOT n.simulated OR current_setting('`+AllowSimulatedParam+`', true) = 'on')
		GROUP BY n.sku`)
	if err != nil {
		return st, translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		var sku string
		var c SKUCapacity
		if err := rows.Scan(&sku, &c.Total, &c.Free); err != nil {
			return st, translate(err)
		}
		prev := st.SKUs[sku]
		st.SKUs[sku] = SKUCapacity{Total: prev.Total + c.Total, Free: prev.Free + c.Free}
	}
	return st, translate(rows.Err())
}
