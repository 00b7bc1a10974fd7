// Package pgtest gives a test binary one private PostgreSQL cluster and each test a fresh
// database cloned from a migrated template. Real PostgreSQL, never a mock.
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
	mu       sync.Mutex // CREATE DATABASE from a template must not overlap
	counter  atomic.Int64
)

// Main runs m with a private cluster; setup (may be nil) runs once on the template database.
func Main(m *testing.M, setup func(ctx context.Context, connString string) error) int {
	dir, err := os.MkdirTemp("", "pgt")
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	_ = os.Chmod(dir, 0o755)
	ctx := context.Background()
	srv, startErr = pgserver.Start(ctx, pgserver.Options{Dir: dir, Ephemeral: true})
	if startErr != nil {
		if errors.Is(startErr, pgserver.ErrNoBinaries) && os.Getenv("CI") == "" {
			return m.Run() // NewDatabase skips with the reason
		}
		fmt.Fprintln(os.Stderr, "pgtest: start PostgreSQL:", startErr)
		return 1
	}
	defer srv.Stop()
	if err := srv.CreateDatabase(ctx, templateDB, ""); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		return 1
	}
	if setup != nil {
		if err := setup(ctx, srv.ConnString(templateDB)); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: setup:", err)
			return 1
		}
	}
	return m.Run()
}

// Server returns the shared cluster (nil if it could not start).
func Server() *pgserver.Server { return srv }

// NewDatabase creates a fresh database from the template and returns its connection string.
// It is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	if srv == nil {
		if startErr != nil && errors.Is(startErr, pgserver.ErrNoBinaries) {
			t.Skip("PostgreSQL server binaries not found; apt-get install postgresql")
		}
		t.Fatalf("pgtest: no cluster (is TestMain calling pgtest.Main?): %v", startErr)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("t_%d_%s", counter.Add(1), hex.EncodeToString(b[:]))
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		err := srv.CreateDatabase(ctx, name, templateDB)
		mu.Unlock()
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "being accessed by other users") || time.Now().After(deadline) {
			t.Fatalf("pgtest: create database: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // the template's last connection is closing
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, srv.ConnString("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return srv.ConnString(name)
}
