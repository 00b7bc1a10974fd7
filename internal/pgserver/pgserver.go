// Package pgserver runs a private PostgreSQL cluster from the machine's server binaries:
// initdb on first start, pg_ctl start/stop, a Unix socket only (no TCP). The controller uses
// it as its embedded default database; tests use it through pgtest. Run as root, the
// cluster runs as the unprivileged postgres (or nobody) user, as PostgreSQL requires.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Superuser is the role initdb creates.
const Superuser = "gpuaas"

// Options configures Start.
type Options struct {
	Dir    string // cluster in Dir/data, socket in Dir/run, log in Dir/postgres.log
	Logger *slog.Logger
	BinDir string // default: FindBinDir()
	// Ephemeral trades durability for speed (tests): initdb --no-sync, fsync off.
	Ephemeral bool
}

// Server is a running cluster.
type Server struct {
	opts    Options
	bin     string
	dataDir string
	sockDir string
	cred    *syscall.Credential
	lock    *os.File
	mu      sync.Mutex
	stopped bool
}

func (s *Server) unlock() {
	if s.lock != nil {
		_ = syscall.Flock(int(s.lock.Fd()), syscall.LOCK_UN)
		s.lock.Close()
		s.lock = nil
	}
}

// ErrNoBinaries is returned when initdb/pg_ctl cannot be found.
var ErrNoBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found; install them with: apt-get install postgresql")

// FindBinDir locates initdb and pg_ctl: PATH first, then /usr/lib/postgresql/*/bin (newest).
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if usable(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if usable(d) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func usable(dir string) bool {
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// runAs picks the unprivileged user when we are root.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, errors.New("pgserver: running as root but neither a postgres nor a nobody user exists to run PostgreSQL")
}

// Start initializes the cluster if needed and starts it.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("pgserver: Dir is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = dir
	bin := opts.BinDir
	if bin == "" {
		if bin, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if !usable(bin) {
		return nil, fmt.Errorf("pgserver: %s: %w", bin, ErrNoBinaries)
	}
	s := &Server{opts: opts, bin: bin, dataDir: filepath.Join(dir, "data"), sockDir: filepath.Join(dir, "run")}
	if n := len(filepath.Join(s.sockDir, ".s.PGSQL.5432")); n > 100 {
		return nil, fmt.Errorf("pgserver: socket path %s/.s.PGSQL.5432 is %d bytes; Unix sockets allow about 100: use a shorter state directory", s.sockDir, n)
	}
	if s.cred, err = runAs(); err != nil {
		return nil, err
	}
	if err := s.prepareDirs(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := s.initdb(ctx); err != nil {
			return nil, err
		}
	}
	// One owner per cluster: an exclusive lock held for the Server's lifetime. Holding it
	// proves any postmaster still running on this data dir is an orphan of a killed owner.
	lock, err := os.OpenFile(filepath.Join(dir, "pgserver.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("pgserver: %s is in use by another process (lock held)", dir)
	}
	s.lock = lock
	if err := s.clearStalePid(ctx); err != nil {
		s.unlock()
		return nil, err
	}
	if err := s.start(ctx); err != nil {
		s.unlock()
		return nil, err
	}
	if err := s.waitReady(ctx, 30*time.Second); err != nil {
		_ = s.Stop()
		return nil, err
	}
	opts.Logger.Debug("postgres started", "dir", dir, "bin", bin)
	return s, nil
}

func (s *Server) prepareDirs() error {
	for _, d := range []string{s.opts.Dir, s.dataDir, s.sockDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if s.cred != nil {
			if err := os.Chown(d, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("pgserver: chown %s: %w", d, err)
			}
		}
	}
	if s.cred != nil {
		// Every parent must be traversable by the postgres user.
		for p := filepath.Dir(s.opts.Dir); p != "/"; p = filepath.Dir(p) {
			fi, err := os.Stat(p)
			if err != nil {
				return err
			}
			if fi.Mode().Perm()&0o001 == 0 {
				return fmt.Errorf("pgserver: %s (mode %04o) is not traversable by the postgres user (uid %d); chmod o+x it or choose another state directory", p, fi.Mode().Perm(), s.cred.Uid)
			}
		}
	}
	return nil
}

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
		cmd.Dir = "/"
	}
	return cmd
}

func (s *Server) initdb(ctx context.Context) error {
	args := []string{"-D", s.dataDir, "-U", Superuser, "--auth=trust", "--encoding=UTF8", "--locale=C"}
	if s.opts.Ephemeral {
		args = append(args, "--no-sync")
	}
	out, err := s.command(ctx, "initdb", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgserver: initdb: %w: %s", err, tail(string(out)))
	}
	return nil
}

// clearStalePid handles a postmaster.pid left by a killed run. We hold the cluster lock, so
// no live owner exists: a dead pid's file is removed; a postmaster still running (orphaned
// when its owner was killed) is stopped cleanly, then started again by us.
func (s *Server) clearStalePid(ctx context.Context) error {
	pidFile := filepath.Join(s.dataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err == nil && pid > 0 && alivePostgres(pid) {
		s.opts.Logger.Warn("stopping PostgreSQL orphaned by a previous run", "pid", pid)
		out, err := s.command(ctx, "pg_ctl", "stop", "-m", "fast", "-w", "-D", s.dataDir).CombinedOutput()
		if err != nil {
			return fmt.Errorf("pgserver: PostgreSQL (pid %d) is running on %s and could not be stopped: %w: %s", pid, s.dataDir, err, tail(string(out)))
		}
		return nil
	}
	s.opts.Logger.Warn("removing stale postmaster.pid from a previous run", "pid", first)
	if err := os.Remove(pidFile); err != nil {
		return err
	}
	// The socket lock names the same dead postmaster (perhaps an unreaped zombie, which
	// PostgreSQL would still take for alive). The socket dir is ours alone under the lock.
	stale, _ := filepath.Glob(filepath.Join(s.sockDir, ".s.PGSQL.*"))
	for _, f := range stale {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func alivePostgres(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return strings.Contains(string(cmdline), "postgres")
}

func (s *Server) start(ctx context.Context) error {
	o := []string{"-c", "listen_addresses=", "-c", "unix_socket_directories=" + s.sockDir,
		"-c", "max_connections=300", "-c", "shared_buffers=128MB", "-c", "log_min_messages=warning"}
	if s.opts.Ephemeral {
		o = append(o, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	logFile := filepath.Join(s.opts.Dir, "postgres.log")
	if s.cred != nil {
		f, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		f.Close()
		if err := os.Chown(logFile, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	out, err := s.command(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", s.dataDir, "-l", logFile,
		"-o", strings.Join(quoteAll(o), " ")).CombinedOutput()
	if err != nil {
		logTail, _ := os.ReadFile(logFile)
		return fmt.Errorf("pgserver: pg_ctl start: %w: %s\n%s", err, tail(string(out)), tail(string(logTail)))
	}
	return nil
}

func quoteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.HasPrefix(a, "-") {
			out[i] = a
		} else {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return out
}

func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

func (s *Server) waitReady(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, s.ConnString("postgres"))
		if err == nil {
			err = conn.QueryRow(cctx, "SELECT 1").Scan(new(int))
			conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(50 * time.Millisecond) // readiness poll, bounded by the deadline
	}
	return fmt.Errorf("pgserver: not ready after %s: %w", d, last)
}

// ConnString is a pgx connection string for database on the Unix socket.
func (s *Server) ConnString(database string) string {
	return fmt.Sprintf("host=%s port=5432 user=%s dbname=%s sslmode=disable", s.sockDir, Superuser, database)
}

// SocketDir is the directory holding the Unix socket.
func (s *Server) SocketDir() string { return s.sockDir }

// CreateDatabase creates name (optionally from template).
func (s *Server) CreateDatabase(ctx context.Context, name, template string) error {
	conn, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: connect: %w", err)
	}
	defer conn.Close(ctx)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	_, err = conn.Exec(ctx, sql)
	return err
}

// Stop stops the cluster (fast shutdown). Safe to call twice.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer s.unlock()
	out, err := s.command(ctx, "pg_ctl", "stop", "-m", "fast", "-w", "-D", s.dataDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgserver: pg_ctl stop: %w: %s", err, tail(string(out)))
	}
	return nil
}
