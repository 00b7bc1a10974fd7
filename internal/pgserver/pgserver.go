// Package pgserver runs a private PostgreSQL cluster from the machine's server binaries:
// initdb on first start, pg_ctl start/stop, a Unix socket only (no TCP), trust
// authentication on that socket. The controller uses it as its embedded default database;
// tests use it through pgtest. Run as root, the cluster runs as the unprivileged postgres
// (or nobody) user, as PostgreSQL requires.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Superuser is the role initdb creates; ConnString connects as it.
const Superuser = "gpuaas"

// Port names the socket file (.s.PGSQL.5432); there is no TCP listener.
const Port = 5432

// maxSocketPath is the longest Unix socket path (sun_path holds 108 bytes with the NUL).
const maxSocketPath = 107

// Options configures Start.
type Options struct {
	Dir    string       // the cluster lives in Dir/data, the socket in Dir/run, the log in Dir/postgres.log
	Logger *slog.Logger // optional
	BinDir string       // optional; default FindBinDir()
	// Ephemeral trades durability for speed, for tests: initdb --no-sync; fsync,
	// synchronous_commit and full_page_writes off. The cluster is also stopped, and its
	// files removed, when this process exits without calling Stop (killed, timed out).
	Ephemeral bool
	// Settings are extra server settings (name=value), e.g. benchmarks loading
	// pg_stat_statements.
	Settings []string
	// StandbyOf makes a new cluster a streaming standby of that running server: its data
	// directory is a pg_basebackup of it (with standby.signal and primary_conninfo) instead
	// of an initdb. Promote makes it a primary. Ignored when the data directory exists.
	StandbyOf *Server
}

// Server is a running cluster, owned by this process until Stop.
type Server struct {
	opts    Options
	log     *slog.Logger
	bin     string
	dir     string
	dataDir string
	sockDir string
	cred    *syscall.Credential // nil: run as ourselves

	mu       sync.Mutex
	lockFile *os.File
	watchdog *watchdog
	stopped  bool
}

// Start initializes the cluster on first use and starts it, returning once it answers
// queries. It fails with ErrAlreadyRunning when another process owns the cluster.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	if err := s.prepare(); err != nil {
		return nil, err
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	if err := s.boot(ctx); err != nil {
		s.unlock()
		return nil, err
	}
	if s.opts.Ephemeral {
		if s.watchdog, err = s.startWatchdog(); err != nil {
			_ = s.Stop()
			return nil, err
		}
	}
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		if serr := s.Stop(); serr != nil {
			s.log.Warn("stop after failed start", "err", serr)
		}
		return nil, err
	}
	s.log.Info("postgres started", "dir", s.dir, "bin", s.bin, "ephemeral", s.opts.Ephemeral)
	return s, nil
}

func newServer(opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("pgserver: Options.Dir is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	s := &Server{opts: opts, log: opts.Logger, dir: dir,
		dataDir: filepath.Join(dir, "data"), sockDir: filepath.Join(dir, "run")}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if sock := s.socketPath(); len(sock) > maxSocketPath {
		return nil, fmt.Errorf("pgserver: socket path %s is too long (%d bytes; Unix sockets allow %d): use a shorter state directory", sock, len(sock), maxSocketPath)
	}
	if s.bin = opts.BinDir; s.bin == "" {
		if s.bin, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if !usable(s.bin) {
		return nil, fmt.Errorf("pgserver: %s: %w", s.bin, ErrNoBinaries)
	}
	if s.cred, err = runAs(); err != nil {
		return nil, err
	}
	return s, nil
}

// prepare creates Dir, Dir/data and Dir/run, owned by the PostgreSQL user, which must be
// able to reach them.
func (s *Server) prepare() error {
	if err := os.MkdirAll(filepath.Dir(s.dir), 0o755); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if s.cred != nil {
		if err := checkTraversable(s.dir, s.cred); err != nil {
			return err
		}
	}
	for _, d := range []string{s.dir, s.dataDir, s.sockDir} {
		if err := s.mkdirOwned(d); err != nil {
			return err
		}
	}
	return nil
}

// boot runs initdb on an empty data dir, clears what a killed predecessor left, and starts
// the postmaster.
func (s *Server) boot(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(s.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) && s.opts.StandbyOf != nil {
		if err := s.baseBackup(ctx, s.opts.StandbyOf); err != nil {
			return err
		}
	} else if errors.Is(err, os.ErrNotExist) {
		if err := s.initdb(ctx); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if err := s.recover(ctx); err != nil {
		return err
	}
	return s.startPostmaster(ctx)
}

func (s *Server) socketPath() string {
	return filepath.Join(s.sockDir, fmt.Sprintf(".s.PGSQL.%d", Port))
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// LogPath is the server's log file.
func (s *Server) LogPath() string { return s.logPath() }

// PID is the running postmaster's process id (benchmarks read its CPU time from /proc).
func (s *Server) PID() (int, error) {
	pid, err := postmasterPID(s.dataDir)
	if err == nil && pid == 0 {
		err = fmt.Errorf("pgserver: %s has no postmaster.pid: not running", s.dataDir)
	}
	return pid, err
}

// SocketDir is the directory holding the Unix socket (the host in ConnString).
func (s *Server) SocketDir() string { return s.sockDir }

// ConnString is a pgx keyword/value connection string for database over the Unix socket.
func (s *Server) ConnString(database string) string {
	return strings.Join([]string{
		kv("host", s.sockDir), kv("port", fmt.Sprint(Port)), kv("user", Superuser),
		kv("dbname", database), kv("sslmode", "disable"),
	}, " ")
}

// ConnStringAt is ConnString for the cluster Start(Options{Dir: dir}) runs, without owning
// it: a maintenance command (backup) reaching the cluster a running controller owns.
func ConnStringAt(dir, database string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	return (&Server{sockDir: filepath.Join(abs, "run")}).ConnString(database)
}

// kv quotes a keyword/value pair as libpq (and pgx) parse it.
func kv(key, value string) string {
	if value != "" && !strings.ContainsAny(value, " \t\n\r'\\") {
		return key + "=" + value
	}
	return key + "='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(value) + "'"
}

// CreateDatabase creates database name, cloned from template ("" for the default).
func (s *Server) CreateDatabase(ctx context.Context, name, template string) error {
	if name == "" {
		return errors.New("pgserver: create database: empty name")
	}
	conn, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgserver: create database %s: %w", name, err)
	}
	return nil
}

// Stop shuts the cluster down (pg_ctl stop -m fast) and releases it. Calls after the first
// return nil.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	defer s.unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if pid, _ := postmasterPID(s.dataDir); pid != 0 && postmasterOf(pid, s.dataDir) { // a killed one has nothing to stop
		out, err := s.command(ctx, "pg_ctl", "stop", "-D", s.dataDir, "-m", "fast", "-w", "-t", "60").CombinedOutput()
		if err != nil {
			return fmt.Errorf("pgserver: pg_ctl stop: %w: %s", err, tail(string(out)))
		}
	}
	if s.watchdog != nil {
		if err := s.watchdog.dismiss(); err != nil {
			return err
		}
		s.watchdog = nil
	}
	s.log.Info("postgres stopped", "dir", s.dir)
	return nil
}
