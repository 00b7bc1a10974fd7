package labguest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
)

// RestartEnv must be "1" for a test to restart libvirtd: the restart breaks any other lab
// test's virsh call in flight, so those tests run alone (`make lab-libvirtd`).
const RestartEnv = "GPUAAS_LAB_LIBVIRTD_RESTART"

// LibvirtdPIDFile is where a libvirtd started without systemd (`libvirtd -d`) records itself.
const LibvirtdPIDFile = "/run/libvirtd.pid"

// RestartLibvirtd stops the running libvirtd (SIGTERM to the process its pid file names:
// running QEMU guests live on, as they do across a package upgrade), starts it again with
// `libvirtd -d`, and returns once its socket answers. The lab's hosts run libvirtd without
// systemd; lab tests use this to check that hostd carries on across a libvirtd restart.
func RestartLibvirtd(ctx context.Context) error {
	b, err := os.ReadFile(LibvirtdPIDFile)
	if err != nil {
		return fmt.Errorf("libvirtd pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("libvirtd pid file %s holds %q", LibvirtdPIDFile, b)
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || strings.TrimSpace(string(comm)) != "libvirtd" {
		return fmt.Errorf("pid %d from %s is not libvirtd (%q, %v)", pid, LibvirtdPIDFile, comm, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping libvirtd (pid %d): %w", pid, err)
	}
	if err := until(ctx, func() error {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			return fmt.Errorf("libvirtd (pid %d) still running", pid)
		}
		return nil
	}); err != nil {
		return err
	}
	if out, err := (hostfs.Exec{}).Run(ctx, "libvirtd", "-d"); err != nil {
		return fmt.Errorf("starting libvirtd: %v: %s", err, out)
	}
	return until(ctx, func() error {
		h, err := hypervisor.Connect(hypervisor.DefaultSocket)
		if err != nil {
			return err
		}
		defer h.Close()
		_, err = h.List("")
		return err
	})
}

// until retries fn every 100 ms until it succeeds or ctx ends (returning its last error).
func until(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
