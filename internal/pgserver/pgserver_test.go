package pgserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// needPostgres skips (or, in CI, fails) without the server binaries.
func needPostgres(t *testing.T) {
	t.Helper()
	if _, err := FindBinDir(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// clusterDir is a short, traversable temp dir (t.TempDir's parents are 0700, and long).
func clusterDir(t *testing.T) string {
	t.Helper()
	needPostgres(t)
	d, err := os.MkdirTemp("", "pgs")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func start(t *testing.T, dir string) *Server {
	t.Helper()
	return startWith(t, Options{Dir: dir, Ephemeral: true})
}

func startWith(t *testing.T, opts Options) *Server {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	s, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

func connect(t *testing.T, s *Server, db string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.ConnString(db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx) })
	return c
}

func exec1(t *testing.T, s *Server, db, sql string) {
	t.Helper()
	if _, err := connect(t, s, db).Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, s *Server, db string) int {
	t.Helper()
	var n int
	if err := connect(t, s, db).QueryRow(context.Background(), "SELECT count(*) FROM kept").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond) // poll interval, bounded by the deadline
	}
}

func TestStartStopRestartKeepsData(t *testing.T) {
	t.Parallel()
	dir := clusterDir(t)
	ctx := context.Background()
	s := start(t, dir)
	if err := s.CreateDatabase(ctx, "app", ""); err != nil {
		t.Fatal(err)
	}
	exec1(t, s, "app", "CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)")

	var listen, user, walCompression string
	c := connect(t, s, "app")
	if err := c.QueryRow(ctx, "SELECT current_setting('listen_addresses'), current_user, current_setting('wal_compression')").Scan(&listen, &user, &walCompression); err != nil {
		t.Fatal(err)
	}
	if listen != "" || user != Superuser {
		t.Fatalf("listen_addresses=%q user=%q; want no TCP and %q", listen, user, Superuser)
	}
	if walCompression == "off" { // a durable cluster's full-page images are compressed
		t.Fatalf("wal_compression=%q; want full-page images compressed", walCompression)
	}
	if _, err := os.Stat(filepath.Join(dir, "run", ".s.PGSQL.5432")); err != nil {
		t.Fatalf("socket missing: %v", err)
	}
	c.Close(ctx)

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("postmaster.pid after Stop: %v", err)
	}
	s2 := start(t, dir)
	if n := count(t, s2, "app"); n != 1 {
		t.Fatalf("rows after restart = %d, want 1", n)
	}
}

func TestCreateDatabaseQuotesNames(t *testing.T) {
	t.Parallel()
	s := start(t, clusterDir(t))
	ctx := context.Background()
	name := `we"ird 'db\`
	if err := s.CreateDatabase(ctx, name, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateDatabase(ctx, "copy", name); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := connect(t, s, name).QueryRow(ctx, "SELECT current_database()").Scan(&got); err != nil || got != name {
		t.Fatalf("current_database() = %q, %v", got, err)
	}
	if err := s.CreateDatabase(ctx, name, ""); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("duplicate create: %v", err)
	}
}

func TestAlreadyRunningRefused(t *testing.T) {
	t.Parallel()
	dir := clusterDir(t)
	s := start(t, dir)
	pid, err := postmasterPID(s.dataDir)
	if err != nil || pid == 0 {
		t.Fatalf("postmaster.pid: %d, %v", pid, err)
	}
	_, err = Start(context.Background(), Options{Dir: dir, Ephemeral: true})
	if !errors.Is(err, ErrAlreadyRunning) || !strings.Contains(err.Error(), fmt.Sprintf("already running (pid %d)", pid)) {
		t.Fatalf("second Start on a live cluster: %v", err)
	}
	// The first server is untouched.
	exec1(t, s, "postgres", "SELECT 1")
}

// A controller killed without Stop leaves its postmaster running (an orphan): the next Start
// stops it and starts its own.
func TestOrphanedPostmasterReplaced(t *testing.T) {
	t.Parallel()
	dir := clusterDir(t)
	ctx := context.Background()
	s := start(t, dir)
	if err := s.CreateDatabase(ctx, "app", ""); err != nil {
		t.Fatal(err)
	}
	exec1(t, s, "app", "CREATE TABLE kept (x int); INSERT INTO kept VALUES (1), (2)")
	old, _ := postmasterPID(s.dataDir)
	s.unlock() // the owner dies: its lock goes, the postmaster keeps running

	s2 := start(t, dir)
	if pid, _ := postmasterPID(s2.dataDir); pid == old || postmasterOf(old, s2.dataDir) {
		t.Fatalf("orphan %d still serving (new pid %d)", old, pid)
	}
	if n := count(t, s2, "app"); n != 2 {
		t.Fatalf("rows = %d, want 2", n)
	}
}

// A postmaster killed -9 (with its owner) leaves a stale postmaster.pid; Start recovers. Not
// Ephemeral: asynchronous commit would lose the last commits to the kill, by design.
func TestStalePostmasterPID(t *testing.T) {
	t.Parallel()
	dir := clusterDir(t)
	ctx := context.Background()
	s := startWith(t, Options{Dir: dir})
	if err := s.CreateDatabase(ctx, "app", ""); err != nil {
		t.Fatal(err)
	}
	exec1(t, s, "app", "CREATE TABLE kept (x int); INSERT INTO kept VALUES (1), (2), (3)")
	pid, err := postmasterPID(s.dataDir)
	if err != nil || pid == 0 {
		t.Fatalf("postmaster.pid: %d, %v", pid, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.unlock() // its owner died too
	waitFor(t, "the killed postmaster to die", 10*time.Second, func() bool { return !postmasterOf(pid, s.dataDir) })
	if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); err != nil {
		t.Fatalf("want a stale postmaster.pid: %v", err)
	}

	s2 := startWith(t, Options{Dir: dir}) // waits out the old backends, removes the stale files
	if n := count(t, s2, "app"); n != 3 {
		t.Fatalf("rows after crash = %d, want 3", n)
	}
}

func TestMissingBinaries(t *testing.T) {
	const want = "PostgreSQL server binaries (initdb, pg_ctl) not found; install them with: apt-get install postgresql"
	_, err := Start(context.Background(), Options{Dir: t.TempDir(), BinDir: t.TempDir()})
	if !errors.Is(err, ErrNoBinaries) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start with an empty BinDir: %v", err)
	}
	noPath := func(string) (string, error) { return "", errors.New("not on PATH") }
	_, err = findBinDir(noPath, filepath.Join(t.TempDir(), "*", "bin"))
	if err == nil || err.Error() != want {
		t.Fatalf("findBinDir: %v", err)
	}
}

func TestFindBinDirPrefersHighestVersion(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"9.6", "13", "15", "16"} {
		bin := filepath.Join(root, v, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if v == "16" {
			continue // incomplete install: skipped
		}
		for _, b := range serverBinaries {
			if err := os.WriteFile(filepath.Join(bin, b), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	noPath := func(string) (string, error) { return "", errors.New("not on PATH") }
	got, err := findBinDir(noPath, filepath.Join(root, "*", "bin"))
	if want := filepath.Join(root, "15", "bin"); err != nil || got != want {
		t.Fatalf("findBinDir = %q, %v; want %q", got, err, want)
	}
}

func TestSocketPathTooLong(t *testing.T) {
	long := filepath.Join(os.TempDir(), strings.Repeat("d", 100))
	_, err := Start(context.Background(), Options{Dir: long, BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "socket path") || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(long); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Start created %s before failing: %v", long, err)
	}
}

func TestUntraversableParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root hands the cluster to another user")
	}
	needPostgres(t)
	parent := clusterDir(t)
	private := filepath.Join(parent, "p")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Options{Dir: filepath.Join(private, "pg"), Ephemeral: true})
	if err == nil || !strings.Contains(err.Error(), private) || !strings.Contains(err.Error(), "not traversable") {
		t.Fatalf("err = %v", err)
	}
}

func TestConnStringQuoting(t *testing.T) {
	s := &Server{sockDir: "/tmp/a b/run"}
	got := s.ConnString(`o'k\`)
	want := `host='/tmp/a b/run' port=5432 user=gpuaas dbname='o\'k\\' sslmode=disable`
	if got != want {
		t.Fatalf("ConnString = %s\nwant          %s", got, want)
	}
	cfg, err := pgx.ParseConfig(got)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "/tmp/a b/run" || cfg.Database != `o'k\` || cfg.User != Superuser || cfg.Port != 5432 {
		t.Fatalf("parsed %+v", cfg.Config)
	}
}

// A postmaster.pid naming a live process that is not this cluster's postgres (the pid was
// recycled after a reboot or crash) is stale too.
func TestRecycledPID(t *testing.T) {
	t.Parallel()
	dir := clusterDir(t)
	s := start(t, dir)
	exec1(t, s, "postgres", "CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)")
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	stale := fmt.Sprintf("%d\n%s/data\n1700000000\n5432\n%s/run\n\n  5432001         0\nready   \n", other.Process.Pid, dir, dir)
	if err := os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"), []byte(stale), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := start(t, dir)
	if n := count(t, s2, "postgres"); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
}
