package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrAlreadyRunning is wrapped by Start's error when another process owns the cluster.
var ErrAlreadyRunning = errors.New("already running")

const lockName = "pgserver.lock"

// lock takes Dir/pgserver.lock for the Server's lifetime: one owner per cluster. Holding it
// also proves that a postmaster still running on the data dir is an orphan of a killed owner.
// The descriptor is close-on-exec, so the postmaster never inherits it.
func (s *Server) lock() error {
	path := filepath.Join(s.dir, lockName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("pgserver: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return s.alreadyRunning()
		}
		return fmt.Errorf("pgserver: lock %s: %w", path, err)
	}
	// Who holds it, for the message a second Start gets.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	s.lockFile = f
	return nil
}

func (s *Server) unlock() {
	if s.lockFile != nil {
		_ = syscall.Flock(int(s.lockFile.Fd()), syscall.LOCK_UN)
		_ = s.lockFile.Close()
		s.lockFile = nil
	}
}

func (s *Server) alreadyRunning() error {
	owner := "another process"
	if b, err := os.ReadFile(filepath.Join(s.dir, lockName)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			owner = "process " + strconv.Itoa(pid)
		}
	}
	if pid, err := postmasterPID(s.dataDir); err == nil && pid > 0 {
		return fmt.Errorf("pgserver: PostgreSQL on %s is %w (pid %d), owned by %s", s.dataDir, ErrAlreadyRunning, pid, owner)
	}
	return fmt.Errorf("pgserver: %s is in use by %s: %w", s.dir, owner, ErrAlreadyRunning)
}

// postmasterPID reads the first line of dataDir/postmaster.pid (0 if there is none).
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	return pid, nil
}

// recover makes the data dir startable after a previous owner died. We hold the lock, so no
// live owner exists: a postmaster still running on the data dir (orphaned when its owner was
// killed) is stopped cleanly; a postmaster.pid naming a dead process (or a recycled pid, or
// an unreaped zombie, which PostgreSQL would take for alive) is removed once no process of
// the old cluster remains.
func (s *Server) recover(ctx context.Context) error {
	pid, err := postmasterPID(s.dataDir)
	if err != nil {
		s.log.Warn("unreadable postmaster.pid; treating it as stale", "err", err)
	}
	if pid > 0 && postmasterOf(pid, s.dataDir) {
		s.log.Warn("stopping PostgreSQL orphaned by a previous run", "pid", pid)
		out, err := s.command(ctx, "pg_ctl", "stop", "-D", s.dataDir, "-m", "fast", "-w", "-t", "60").CombinedOutput()
		if err != nil {
			return fmt.Errorf("pgserver: PostgreSQL (pid %d) is running on %s and could not be stopped: %w: %s", pid, s.dataDir, err, tail(string(out)))
		}
		return nil
	}
	if err := s.waitLeftovers(ctx, 15*time.Second); err != nil {
		return err
	}
	stale := []string{filepath.Join(s.dataDir, "postmaster.pid")}
	locks, _ := filepath.Glob(filepath.Join(s.sockDir, ".s.PGSQL.*"))
	stale = append(stale, locks...)
	for _, f := range stale {
		err := os.Remove(f)
		if err == nil {
			s.log.Warn("removed stale file from a previous run", "file", f, "pid", pid)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pgserver: %w", err)
		}
	}
	return nil
}

// waitLeftovers waits for processes of a dead postmaster (backends exit soon after it dies)
// to go: starting a new postmaster beside them could corrupt the cluster.
func (s *Server) waitLeftovers(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		pids := processesIn(s.dataDir)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgserver: processes %v of an earlier PostgreSQL still use %s; stop them before starting", pids, s.dataDir)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgserver: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// postmasterOf reports whether pid is a live (not zombie) postgres serving dataDir.
// PostgreSQL processes run with the data directory as their working directory.
func postmasterOf(pid int, dataDir string) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "postgres") {
		return false // gone, a zombie (empty cmdline), or a recycled pid
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if errors.Is(err, os.ErrPermission) {
		return true // cannot tell; do not assume it is safe to start beside it
	}
	return err == nil && cwd == realPath(dataDir)
}

// processesIn lists live postgres processes whose working directory is dir.
func processesIn(dir string) []int {
	dir = realPath(dir)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || cwd != dir {
			continue
		}
		if cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(cmdline), "postgres") {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// realPath resolves symlinks, as the kernel does for /proc/PID/cwd.
func realPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}
