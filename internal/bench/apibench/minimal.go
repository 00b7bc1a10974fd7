package apibench

import (
	"context"
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// MinimalDB is the database of the minimal-schema reference, in the fleet's own PostgreSQL
// cluster (the same server, settings and disk as our schema).
const MinimalDB = "bench_minimal"

// minimalSchema is the least a reservation needs: slots with a status and a primary key,
// allocations, claims. No triggers, no audit, no outbox, no history, no secondary index:
// what the same reserve and release cost when the database holds no guarantee beyond the
// row lock, the reference our schema's raw script is measured against.
const minimalSchema = `
CREATE TABLE slots (node int NOT NULL, slot_index int NOT NULL, status text NOT NULL DEFAULT 'available',
  PRIMARY KEY (node, slot_index));
CREATE TABLE allocations (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), node int NOT NULL, gpus int NOT NULL,
  status text NOT NULL DEFAULT 'requested', created_at timestamptz NOT NULL DEFAULT now(), releasing_at timestamptz,
  released_at timestamptz);
CREATE TABLE claims (allocation_id uuid NOT NULL, node int NOT NULL, slot_index int NOT NULL,
  status text NOT NULL DEFAULT 'reserved', released_at timestamptz, PRIMARY KEY (allocation_id, slot_index));
`

// minimalReserveRelease is reserveRelease on the minimal schema: four slots of a random node
// locked SKIP LOCKED and reserved, an allocation and four claims inserted; then the
// allocation locked, moved to releasing, the slots made available, the claims released and
// the allocation ended. The same statements, in the same transactions.
const minimalReserveRelease = `\set node random(1, :nodes)
BEGIN;
SELECT array_agg(slot_index) AS idx, count(*) AS n FROM (
  SELECT slot_index FROM slots WHERE node = :node AND status = 'available'
  ORDER BY slot_index LIMIT 4 FOR UPDATE SKIP LOCKED) x \gset
\if :n = 4
UPDATE slots SET status = 'reserved' WHERE node = :node AND slot_index = ANY(:idx::int[]);
INSERT INTO allocations (node, gpus) VALUES (:node, 4) RETURNING id AS alloc \gset
INSERT INTO claims (allocation_id, node, slot_index) SELECT :alloc::uuid, :node, unnest(:idx::int[]);
COMMIT;
BEGIN;
SELECT id FROM allocations WHERE id = :alloc::uuid FOR UPDATE;
UPDATE allocations SET status = 'releasing', releasing_at = now() WHERE id = :alloc::uuid;
UPDATE slots SET status = 'available' WHERE node = :node AND slot_index = ANY(:idx::int[]);
UPDATE claims SET status = 'released', released_at = now() WHERE allocation_id = :alloc::uuid;
UPDATE allocations SET status = 'released', released_at = now() WHERE id = :alloc::uuid;
COMMIT;
\else
COMMIT;
\endif
`

// PrepareMinimal creates the minimal-schema reference's database beside env's (dropped
// first if a previous run left it) with nodes nodes of 8 slots.
func PrepareMinimal(ctx context.Context, env *benchenv.Env, nodes int) error {
	if env.PG == nil {
		return fmt.Errorf("minimal reference: needs the bench's own PostgreSQL cluster")
	}
	if err := env.Exec(ctx, `DROP DATABASE IF EXISTS `+MinimalDB); err != nil {
		return err
	}
	if err := env.PG.CreateDatabase(ctx, MinimalDB, ""); err != nil {
		return err
	}
	return env.ExecIn(ctx, MinimalDB, minimalSchema, fmt.Sprintf(`INSERT INTO slots (node, slot_index)
		SELECT n, i FROM generate_series(1, %d) n, generate_series(0, 7) i`, nodes), `VACUUM ANALYZE`)
}

// CleanupMinimal ends the minimal reference's allocations and frees its slots, then vacuums,
// analyzes and checkpoints (as Cleanup does for our schema), so every run starts from the
// same state. Without the minimal database (a fleet that did not prepare one) it does nothing.
func CleanupMinimal(ctx context.Context, env *benchenv.Env) error {
	n, err := env.Int(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, MinimalDB)
	if err != nil || n == 0 {
		return err
	}
	if err := env.ExecIn(ctx, MinimalDB, `UPDATE slots SET status = 'available' WHERE status <> 'available'`,
		`TRUNCATE claims, allocations`, `VACUUM ANALYZE`); err != nil {
		return err
	}
	return env.Exec(ctx, `CHECKPOINT`)
}

// Minimal runs the minimal-schema reference (kind "minimal") with clients connections for d.
func Minimal(ctx context.Context, env *benchenv.Env, nodes, clients int, d time.Duration) (Result, error) {
	res, err := pgbench(ctx, env, "minimal", MinimalDB, minimalReserveRelease, nodes, clients, d)
	if err == nil {
		res.Notes = "minimal schema (slots, allocations, claims; no triggers, audit or outbox); latency per script"
	}
	return res, err
}

// MinimalDoubleBooked counts the minimal reference's slots holding more than one live claim
// (its only guarantee is the row lock; zero when the script is right).
func MinimalDoubleBooked(ctx context.Context, env *benchenv.Env) (int, error) {
	return env.IntIn(ctx, MinimalDB, `SELECT count(*) FROM (SELECT node, slot_index FROM claims
		WHERE status <> 'released' GROUP BY node, slot_index HAVING count(*) > 1) x`)
}
