package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
)

// v7Time is a UUIDv7's millisecond timestamp, failing the test when id is not a version 7,
// RFC 9562 variant UUID.
func v7Time(t *testing.T, id string) time.Time {
	t.Helper()
	u, err := uuid.Parse(id)
	if err != nil {
		t.Fatalf("%q: %v", id, err)
	}
	if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("%s is version %d, variant %v: want a version 7 RFC 9562 UUID", id, u.Version(), u.Variant())
	}
	ms := int64(u[0])<<40 | int64(u[1])<<32 | int64(u[2])<<24 | int64(u[3])<<16 | int64(u[4])<<8 | int64(u[5])
	return time.UnixMilli(ms)
}

func TestNewIDIsTimeOrdered(t *testing.T) {
	before := time.Now().Truncate(time.Millisecond)
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = NewID()
	}
	after := time.Now()
	seen := map[string]bool{}
	for i, id := range ids {
		if ts := v7Time(t, id); ts.Before(before) || ts.After(after) {
			t.Fatalf("%s carries %v, outside %v..%v", id, ts, before, after)
		}
		if seen[id] {
			t.Fatalf("%s made twice", id)
		}
		seen[id] = true
		if i > 0 && id <= ids[i-1] {
			t.Fatalf("%s made after %s sorts before it: ids must grow, so indexes keyed by them grow at one edge", id, ids[i-1])
		}
	}
}

// The rows every allocation writes get time-ordered ids from the database too (migration 010):
// the raw-SQL bench reference and any other writer that leaves the id to its default.
func TestDatabaseDefaultsToTimeOrderedIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, table := range []string{"allocations", "allocation_resource_claims", "node_tasks"} {
		var def string
		if err := conn.QueryRow(ctx, `SELECT column_default FROM information_schema.columns
			WHERE table_schema = 'public' AND table_name = $1 AND column_name = 'id'`, table).Scan(&def); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		if def != "gpuaas_uuid_v7()" {
			t.Errorf("%s.id defaults to %s, want gpuaas_uuid_v7()", table, def)
		}
	}
	rows, err := conn.Query(ctx, `SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, gpuaas_uuid_v7()::text,
		ceil(extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM generate_series(1, 500)`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var lo, hi int64
		var id string
		if err := r.Scan(&lo, &id, &hi); err != nil {
			return "", err
		}
		if ts := v7Time(t, id).UnixMilli(); ts < lo || ts > hi {
			t.Errorf("%s carries %d ms, outside the statement's clock %d..%d", id, ts, lo, hi)
		}
		return id, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	distinct := map[string]bool{}
	for _, id := range ids {
		distinct[id] = true
	}
	if len(distinct) != len(ids) {
		t.Fatalf("%d distinct ids in %d", len(distinct), len(ids))
	}
}
