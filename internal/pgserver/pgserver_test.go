package pgserver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func tempDir(t *testing.T) string {
	t.Helper()
	if _, err := FindBinDir(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	d, err := os.MkdirTemp("", "pgs")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(d, 0o755)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func exec1(t *testing.T, s *Server, db, sql string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.ConnString(db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, s *Server, db string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.ConnString(db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStartStopRestartKeepsData(t *testing.T) {
	dir := tempDir(t)
	ctx := context.Background()
	s, err := Start(ctx, Options{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateDatabase(ctx, "app", ""); err != nil {
		t.Fatal(err)
	}
	exec1(t, s, "app", "CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)")
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	s2, err := Start(ctx, Options{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Stop()
	if n := count(t, s2, "app"); n != 1 {
		t.Fatalf("rows after restart = %d", n)
	}
	// No TCP: only a Unix socket in Dir/run.
	if _, err := os.Stat(filepath.Join(dir, "run", ".s.PGSQL.5432")); err != nil {
		t.Fatalf("socket missing: %v", err)
	}
}

func TestSecondOwnerRefused(t *testing.T) {
	dir := tempDir(t)
	ctx := context.Background()
	s, err := Start(ctx, Options{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if _, err := Start(ctx, Options{Dir: dir, Ephemeral: true}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Start on a live cluster: %v", err)
	}
}

func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// An owner killed without Stop leaves a running postmaster (orphan) or, if that died too, a
// stale postmaster.pid. Both are handled by the next Start.
func TestCrashRecovery(t *testing.T) {
	dir := tempDir(t)
	ctx := context.Background()
	s, err := Start(ctx, Options{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateDatabase(ctx, "app", ""); err != nil {
		t.Fatal(err)
	}
	exec1(t, s, "app", "CREATE TABLE kept (x int); INSERT INTO kept VALUES (1), (2)")
	s.unlock() // the owner dies: its lock goes, the postmaster keeps running

	s2, err := Start(ctx, Options{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatalf("start over an orphaned postmaster: %v", err)
	}
	if n := count(t, s2, "app"); n != 2 {
		t.Fatalf("rows = %d", n)
	}
	pid := postmasterPID(t, dir)
	s2.unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alivePostgres(pid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // waiting for the killed postmaster to go
	}
	// Children may linger briefly after SIGKILL of the postmaster; Start must cope.
	s3, err := Start(ctx, Options{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatalf("start after kill -9 (stale postmaster.pid): %v", err)
	}
	defer s3.Stop()
	if n := count(t, s3, "app"); n != 2 {
		t.Fatalf("rows after crash = %d", n)
	}
}

func TestMissingBinariesError(t *testing.T) {
	_, err := Start(context.Background(), Options{Dir: t.TempDir(), BinDir: t.TempDir()})
	if !errors.Is(err, ErrNoBinaries) || !strings.Contains(err.Error(), "apt-get install postgresql") {
		t.Fatalf("err = %v", err)
	}
}

func TestSocketPathTooLong(t *testing.T) {
	if _, err := FindBinDir(); err != nil {
		t.Skip(err)
	}
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 90))
	_, err := Start(context.Background(), Options{Dir: long})
	if err == nil || !strings.Contains(err.Error(), "socket path") {
		t.Fatalf("err = %v", err)
	}
}
