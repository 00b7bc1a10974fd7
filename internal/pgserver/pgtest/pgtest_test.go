package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	os.Exit(Main(m, func(ctx context.Context, connString string) error {
		conn, err := pgx.Connect(ctx, connString)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CREATE TABLE migrated (version int); INSERT INTO migrated VALUES (7)")
		return err
	}))
}

func open(t *testing.T, connString string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return conn
}

func TestDatabasesAreIsolatedAndSetUp(t *testing.T) {
	ctx := context.Background()
	a, b := open(t, NewDatabase(t)), open(t, NewDatabase(t))
	for _, c := range []*pgx.Conn{a, b} {
		var v int
		if err := c.QueryRow(ctx, "SELECT version FROM migrated").Scan(&v); err != nil || v != 7 {
			t.Fatalf("setup did not reach %s: %d, %v", c.Config().Database, v, err)
		}
	}
	if a.Config().Database == b.Config().Database {
		t.Fatalf("same database twice: %s", a.Config().Database)
	}
	if _, err := a.Exec(ctx, "CREATE TABLE only_a (x int); INSERT INTO migrated VALUES (8)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_a'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("only_a visible in the other database: %d, %v", n, err)
	}
	if err := b.QueryRow(ctx, "SELECT count(*) FROM migrated").Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows in b = %d, %v", n, err)
	}
}

func TestParallelNewDatabase(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	for i := range 12 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			conn := open(t, NewDatabase(t))
			var n int
			if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM migrated").Scan(&n); err != nil || n != 1 {
				t.Fatalf("migrated rows = %d, %v", n, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[conn.Config().Database] {
				t.Errorf("database %s handed out twice", conn.Config().Database)
			}
			seen[conn.Config().Database] = true
		})
	}
}

func TestDatabaseDroppedAfterTest(t *testing.T) {
	admin := open(t, NewDatabase(t)) // skips without PostgreSQL
	var name string
	t.Run("use", func(t *testing.T) {
		name = open(t, NewDatabase(t)).Config().Database
	})
	var exists bool
	err := admin.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil || exists {
		t.Fatalf("database %s still exists after its test: %v", name, err)
	}
}

func TestTemplateSealed(t *testing.T) {
	NewDatabase(t) // skips without PostgreSQL
	_, err := pgx.Connect(context.Background(), Server().ConnString(templateDB))
	if err == nil {
		t.Fatal("connected to the template database")
	}
}
