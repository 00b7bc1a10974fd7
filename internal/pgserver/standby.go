package pgserver

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// baseBackup fills the empty data directory with a copy of primary taken over the
// replication protocol (pg_basebackup, WAL streamed alongside), writing standby.signal and
// primary_conninfo (-R) so the cluster starts as primary's streaming standby. It names
// itself application_name=standby, which synchronous_standby_names can list.
func (s *Server) baseBackup(ctx context.Context, primary *Server) error {
	conn := strings.Join([]string{kv("host", primary.sockDir), kv("port", fmt.Sprint(Port)), kv("user", Superuser),
		kv("application_name", StandbyName)}, " ")
	s.log.Info("copying primary for a standby", "primary", primary.dataDir, "dir", s.dataDir)
	out, err := s.command(ctx, "pg_basebackup", "-D", s.dataDir, "-d", conn, "-X", "stream", "-R",
		"--checkpoint=fast", "--no-sync").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgserver: pg_basebackup: %w: %s", err, tail(string(out)))
	}
	return nil
}

// StandbyName is the application_name a standby made with Options.StandbyOf connects with.
const StandbyName = "standby"

// Promote ends a standby's recovery (pg_ctl promote, what a failover manager runs) and
// returns once it accepts writes.
func (s *Server) Promote(ctx context.Context) error {
	out, err := s.command(ctx, "pg_ctl", "promote", "-D", s.dataDir, "-w", "-t", "60").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgserver: pg_ctl promote: %w: %s", err, tail(string(out)))
	}
	return nil
}

// Kill ends every process of the cluster with SIGKILL (the postmaster and its backends: a
// lost machine, nothing flushed or sent) and releases it; Start on the same directory
// brings it back through crash recovery.
func (s *Server) Kill() (int, error) {
	pids := processesIn(s.dataDir)
	if len(pids) == 0 {
		return 0, fmt.Errorf("pgserver: no PostgreSQL process runs on %s", s.dataDir)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitLeftovers(ctx, 30*time.Second); err != nil {
		return len(pids), err
	}
	return len(pids), s.Stop() // no postmaster is left to stop: Stop releases the lock and the watchdog
}
