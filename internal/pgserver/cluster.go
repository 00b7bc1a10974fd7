package pgserver

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

func (s *Server) initdb(ctx context.Context) error {
	args := []string{"-D", s.dataDir, "-U", Superuser, "--auth-local=trust", "--auth-host=reject",
		"--encoding=UTF8", "--locale=C"}
	if s.opts.Ephemeral {
		args = append(args, "--no-sync")
	}
	s.log.Info("initializing postgres cluster", "dir", s.dataDir)
	out, err := s.command(ctx, "initdb", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgserver: initdb: %w: %s", err, tail(string(out)))
	}
	return nil
}

// serverSettings are passed to postgres on its command line, overriding postgresql.conf.
func (s *Server) serverSettings() []string {
	set := []string{
		"listen_addresses=", // no TCP
		"unix_socket_directories=" + s.sockDir,
		fmt.Sprintf("port=%d", Port),
		"max_connections=300",
		"shared_buffers=128MB",
		"log_min_messages=warning",
		// The first change of a page after a checkpoint writes the whole page into the WAL;
		// compressed (pglz, which every server has) such an image is about 2.5 times smaller
		// (2.7 to 1.1 KiB an image on the allocation path, measured with
		// internal/bench/schemacost): less WAL for every commit to flush.
		"wal_compression=on",
	}
	if s.opts.Ephemeral {
		set = append(set, "fsync=off", "synchronous_commit=off", "full_page_writes=off")
	}
	return append(set, s.opts.Settings...)
}

func (s *Server) startPostmaster(ctx context.Context) error {
	logPath := s.logPath()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	f.Close()
	if err := s.chown(logPath); err != nil {
		return err
	}
	logStart := fileSize(logPath)
	var o []string
	for _, set := range s.serverSettings() {
		o = append(o, "-c", shellQuote(set)) // pg_ctl hands -o to the shell
	}
	out, err := s.command(ctx, "pg_ctl", "start", "-D", s.dataDir, "-w", "-t", "60", "-l", logPath,
		"-o", strings.Join(o, " ")).CombinedOutput()
	if err != nil {
		s.killHalfStarted()
		return fmt.Errorf("pgserver: pg_ctl start: %w: %s\n%s:\n%s", err, tail(string(out)), logPath, tail(readFrom(logPath, logStart)))
	}
	return nil
}

// killHalfStarted stops a postmaster that pg_ctl gave up waiting for.
func (s *Server) killHalfStarted() {
	pid, _ := postmasterPID(s.dataDir)
	if pid == 0 || !postmasterOf(pid, s.dataDir) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := s.command(ctx, "pg_ctl", "stop", "-D", s.dataDir, "-m", "immediate", "-w").CombinedOutput(); err != nil {
		s.log.Warn("stop half-started postgres", "pid", pid, "err", err, "out", tail(string(out)))
	}
}

// waitReady polls until the server answers SELECT 1, up to d.
func (s *Server) waitReady(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		err := ping(ctx, s.ConnString("postgres"))
		if err == nil {
			return nil
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgserver: not ready after %s: %w", d, err)
		case <-t.C:
		}
	}
}

func ping(ctx context.Context, connString string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// tail keeps the last lines of command output or a log for an error message.
func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

func fileSize(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size()
	}
	return 0
}

// readFrom returns path's contents after offset (what this start wrote to the log).
func readFrom(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if offset > int64(len(b)) {
		offset = 0
	}
	return string(b[offset:])
}
