package store

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
)

// testVersions is the version table of the tests' own migrations: the test database is
// already at the embedded migrations' version in public.schema_version.
const testVersions = "public.test_schema_version"

// A migration that deadlocks with a serving replica's transaction (a rolling upgrade migrates
// under live traffic) is aborted by PostgreSQL, rolled back whole and run again: the schema
// ends at the last version and the replica's transaction commits. Here the migration locks
// table a and waits for b, which the replica's transaction holds; that transaction then asks
// for a, and the deadlock detector, run first by the migration's backend (it has waited
// longer), aborts the migration.
func TestMigrationThatDeadlocksIsRunAgain(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	fsys := fstest.MapFS{
		"001_tables.sql": {Data: []byte("CREATE TABLE a (v int);\nCREATE TABLE b (v int);\n---- create above / drop below ----\n")},
		"002_both.sql":   {Data: []byte("LOCK TABLE a;\nLOCK TABLE b;\nALTER TABLE a ADD COLUMN w int;\n---- create above / drop below ----\n")},
	}
	tern, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer tern.Close(ctx)
	if v, err := migrateFS(ctx, url, fstest.MapFS{"001_tables.sql": fsys["001_tables.sql"]}, testVersions); err != nil || v != 1 {
		t.Fatalf("first migration: version %d, %v", v, err)
	}

	replica, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close(ctx)
	tx, err := replica.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO b VALUES (1)`); err != nil { // holds b
		t.Fatal(err)
	}
	type result struct {
		v   int32
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := migrateFS(ctx, url, fsys, testVersions)
		done <- result{v, err}
	}()
	// Wait until the migration holds a and waits for b (pg_locks: not granted on b).
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := tern.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'b'::regclass AND NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the migration never waited for table b")
		}
		time.Sleep(20 * time.Millisecond) // polling pg_locks, not a timing assumption
	}
	if _, err := tx.Exec(ctx, `INSERT INTO a VALUES (1)`); err != nil { // waits for a: the cycle
		t.Fatalf("the replica's transaction was chosen as the deadlock's victim: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.v != 2 {
		t.Fatalf("the migration after its deadlock: version %d, %v; want 2 and no error", r.v, r.err)
	}
	var cols int
	if err := tern.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'a' AND column_name = 'w'`).Scan(&cols); err != nil || cols != 1 {
		t.Fatalf("column a.w after the migration: %d, %v", cols, err)
	}
}

// A migration that fails for any other reason is not run again: its error is returned.
func TestFailingMigrationIsNotRetried(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	_, err := migrateFS(context.Background(), url, fstest.MapFS{
		"001_bad.sql": {Data: []byte("CREATE TABLE c (v int REFERENCES nowhere (id));\n---- create above / drop below ----\n")},
	}, testVersions)
	if err == nil || lockConflict(err) || !strings.Contains(err.Error(), `"nowhere" does not exist`) {
		t.Fatalf("a migration naming a missing table: %v; want its error", err)
	}
}
