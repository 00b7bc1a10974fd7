package benchenv

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/internal/pki"
)

// Replica starts another controller process against the same database, as a second replica
// behind a load balancer would run: its own state directory under dir holding copies of the
// first one's CA, server certificate, task-signing key and admin token (replicas must share
// them: hosts pin the CA and the signing key). Stop on the replica stops only its process.
func (e *Env) Replica(ctx context.Context, binDir, dir string, extra ...string) (*Env, error) {
	r := &Env{Dir: dir, DBURL: e.DBURL, StateDir: filepath.Join(dir, "state"), TenantID: e.TenantID, Token: e.Token}
	src, dst := pki.Paths{Dir: e.StateDir}, pki.Paths{Dir: r.StateDir}
	for _, f := range []struct{ from, to string }{
		{src.CACert(), dst.CACert()}, {src.CAKey(), dst.CAKey()}, {src.ServerCert(), dst.ServerCert()}, {src.ServerKey(), dst.ServerKey()},
		{src.SigningKey(), dst.SigningKey()}, {src.SigningPub(), dst.SigningPub()}, {src.AdminToken(), dst.AdminToken()},
	} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(f.to), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(f.to, b, 0o600); err != nil {
			return nil, err
		}
	}
	if err := r.StartController(ctx, binDir, extra...); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

// Through is e as seen through replica r's controller: the same database, pools and tenant,
// with r's process and address, so a run measured through it counts r's CPU. Stop the view
// with r.StopController (Stop on it would stop e's database too).
func (e *Env) Through(r *Env) *Env {
	v := *e
	v.ctl, v.exited, v.logFile = r.ctl, r.exited, r.logFile
	v.Server, v.CAFile, v.PprofAddr = r.Server, r.CAFile, r.PprofAddr
	return &v
}

// Addr is the controller's host:port (from its https:// URL).
func (e *Env) Addr() string { return strings.TrimPrefix(e.Server, "https://") }

// KillController ends the controller with SIGKILL (no shutdown of any kind: in-flight
// requests and long polls are cut, nothing is flushed) and reaps it.
func (e *Env) KillController() error {
	if e.ctl == nil || e.ctl.Process == nil {
		return errors.New("no controller running")
	}
	if err := syscall.Kill(e.ctl.Process.Pid, syscall.SIGKILL); err != nil {
		return err
	}
	<-e.exited
	e.ctl = nil
	if e.logFile != nil {
		e.logFile.Close()
	}
	return nil
}

// StopProcess ends a child: SIGTERM, then SIGKILL if it has not exited within 20 s. exited
// delivers the child's Wait result.
func StopProcess(p *os.Process, exited <-chan error) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = p.Kill()
		<-exited
	}
}

// StartLogged starts bin with args, its output appended to logPath, killed if this process
// dies; exited delivers its Wait result (for StopProcess).
func StartLogged(logPath, bin string, args ...string) (*exec.Cmd, <-chan error, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, nil, err
	}
	exited := make(chan error, 1)
	go func() { err := cmd.Wait(); lf.Close(); exited <- err }()
	return cmd, exited, nil
}
