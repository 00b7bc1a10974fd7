package pgserver

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"syscall"
)

// An ephemeral cluster must not outlive the process that started it: a test binary killed
// by -timeout or Ctrl-C runs no cleanup, and would leave a postmaster running on a temp dir
// forever. The watchdog is a shell in its own session reading a pipe from us; when we exit,
// however we exit, the kernel closes the pipe and the shell stops the cluster (immediate
// mode) and removes its files. Stop dismisses it by writing "keep".
const watchdogScript = `read -r word
[ "$word" = keep ] && exit 0
"$1" stop -D "$2" -m immediate -w -t 30 >/dev/null 2>&1
rm -rf "$2" "$3" "$4" "$5"
rmdir "$6" 2>/dev/null
exit 0`

type watchdog struct {
	in  io.WriteCloser
	cmd *exec.Cmd
}

func (s *Server) startWatchdog() (*watchdog, error) {
	cmd := s.commandPath(context.Background(), "/bin/sh", "-c", watchdogScript, "pgserver-watchdog",
		filepath.Join(s.bin, "pg_ctl"), s.dataDir, s.sockDir, s.logPath(), filepath.Join(s.dir, lockName), s.dir)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true // a terminal's Ctrl-C must reach us, not it
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("pgserver: watchdog: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgserver: watchdog: %w", err)
	}
	return &watchdog{in: in, cmd: cmd}, nil
}

// dismiss tells the watchdog to exit without touching the cluster, and reaps it.
func (wd *watchdog) dismiss() error {
	_, werr := io.WriteString(wd.in, "keep\n")
	_ = wd.in.Close()
	if err := wd.cmd.Wait(); err != nil {
		return fmt.Errorf("pgserver: watchdog: %w", err)
	}
	if werr != nil {
		return fmt.Errorf("pgserver: watchdog: %w", werr)
	}
	return nil
}
