// Package pgtest gives a test binary one private PostgreSQL cluster and each test a fresh
// database cloned from a template that setup prepared once (migrations). Real PostgreSQL,
// never a mock:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, store.MigrateForTest)) }
//
//	func TestX(t *testing.T) { st, err := store.Open(ctx, pgtest.NewDatabase(t), ...) }
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/pgserver"
)

const templateDB = "gpuaas_template"

var (
	srv      *pgserver.Server
	startErr error
	createMu sync.Mutex // CREATE DATABASE ... TEMPLATE calls must not overlap
	counter  atomic.Int64
)

// Main runs m with a private cluster; setup (may be nil) runs once against the template
// database before the tests start. It returns m.Run's exit code, or 1 when the cluster
// cannot be set up. Without PostgreSQL binaries the tests still run (NewDatabase skips),
// unless the CI environment variable is set.
func Main(m *testing.M, setup func(ctx context.Context, connString string) error) int {
	if err := begin(setup); err != nil {
		if errors.Is(err, pgserver.ErrNoBinaries) && os.Getenv("CI") == "" {
			startErr = err
			return m.Run() // NewDatabase skips with the reason
		}
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		end()
		return 1
	}
	defer end()
	return m.Run()
}

var clusterDir string

func begin(setup func(ctx context.Context, connString string) error) error {
	if _, err := pgserver.FindBinDir(); err != nil {
		return err
	}
	// Short (the socket path is limited to 107 bytes) and traversable by the postgres user.
	base := os.TempDir()
	if len(base) > 40 {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "pgt")
	if err != nil {
		return err
	}
	clusterDir = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if srv, err = pgserver.Start(ctx, pgserver.Options{Dir: dir, Ephemeral: true}); err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	if err := srv.CreateDatabase(ctx, templateDB, ""); err != nil {
		return err
	}
	if setup != nil {
		if err := setup(ctx, srv.ConnString(templateDB)); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	return sealTemplate(ctx)
}

// sealTemplate closes any connection setup left open (CREATE DATABASE refuses a template in
// use) and keeps tests from connecting to the template by mistake.
func sealTemplate(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, srv.ConnString("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	db := pgx.Identifier{templateDB}.Sanitize()
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+db+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("seal template: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", templateDB); err != nil {
		return fmt.Errorf("seal template: %w", err)
	}
	return nil
}

func end() {
	if srv != nil {
		if err := srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	if clusterDir != "" {
		_ = os.RemoveAll(clusterDir)
	}
}

// Server returns the shared cluster (nil if none is running).
func Server() *pgserver.Server { return srv }

// RequireServer skips t, with how to install them, when the PostgreSQL server binaries are
// missing, and fails it instead under CI (CI must run every test), for tests that start
// their own PostgreSQL rather than use the package's cluster.
func RequireServer(t testing.TB) {
	t.Helper()
	if _, err := pgserver.FindBinDir(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs PostgreSQL server binaries: %v", err)
		}
		t.Skipf("PostgreSQL server binaries not found (apt-get install postgresql): %v", err)
	}
}

// NewDatabase creates a fresh database cloned from the template and returns its connection
// string. It is dropped (WITH (FORCE)) when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	if srv == nil {
		if errors.Is(startErr, pgserver.ErrNoBinaries) {
			t.Skip("PostgreSQL server binaries not found; apt-get install postgresql")
		}
		t.Fatal("pgtest: no cluster: call pgtest.Main from TestMain")
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("t_%d_%s", counter.Add(1), hex.EncodeToString(b[:]))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := create(ctx, name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { drop(t, name) })
	return srv.ConnString(name)
}

// create clones the template, one clone at a time, retrying while the template is briefly
// in use (a connection of setup's that is still closing).
func create(ctx context.Context, name string) error {
	createMu.Lock()
	defer createMu.Unlock()
	for {
		err := srv.CreateDatabase(ctx, name, templateDB)
		if err == nil || !strings.Contains(err.Error(), "is being accessed by other users") {
			return err
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func drop(t testing.TB, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.ConnString("postgres"))
	if err != nil {
		t.Logf("pgtest: drop %s: %v", name, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Logf("pgtest: drop %s: %v", name, err)
	}
}
