package slicevm

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/internal/task"
)

// ReadyMarker is the file the guest writes when its first boot finished (seed 001 gate).
const ReadyMarker = "/var/lib/gpuaas/slice-ready"

// ReadinessError says which stage of the readiness gate failed.
type ReadinessError struct {
	Stage   string // dhcp_lease | tcp_22 | ssh | ready_marker | nvidia_smi
	Err     error
	Console string // the tail of the guest's serial console
}

func (e *ReadinessError) Error() string {
	msg := "readiness " + e.Stage + ": " + e.Err.Error()
	if e.Console != "" {
		msg += "; console tail: " + e.Console
	}
	return msg
}
func (e *ReadinessError) Unwrap() error { return e.Err }

// readiness is seed 001's gate: DHCP lease seen -> TCP 22 -> SSH with the relay key (the
// guest's host key pinned to the slice dir) -> ready marker (and cloud-init done when the
// guest has cloud-init) -> nvidia-smi -L when the profile has GPUs and they are passed through.
func (h *Host) readiness(ctx context.Context, p *task.VMProvision, signer ssh.Signer, since time.Time, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.ReadinessTimeout)
	defer cancel()
	boot := p.Bundles[0]
	t0 := time.Now()
	var stages []string
	mark := func(s string) { stages = append(stages, fmt.Sprintf("%s %.1fs", s, time.Since(t0).Seconds())) }
	fail := func(stage string, err error) (string, error) {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %s (%v)", context.DeadlineExceeded, h.cfg.ReadinessTimeout, err)
		}
		return strings.Join(stages, ", "), &ReadinessError{Stage: stage, Err: err, Console: tailFile(filepath.Join(dir, "console.log"), 12)}
	}
	if err := poll(ctx, func() error {
		if seen := h.cfg.DHCP.LeaseSeen(boot.MACAddress); seen.IsZero() || seen.Before(since.Add(-time.Second)) {
			return fmt.Errorf("no DHCP lease for %s yet", boot.MACAddress)
		}
		return nil
	}); err != nil {
		return fail("dhcp_lease", err)
	}
	mark("dhcp")
	addr := net.JoinHostPort(boot.PrivateIP, strconv.Itoa(h.cfg.GuestSSHPort))
	if err := poll(ctx, func() error {
		c, err := (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		return fail("tcp_22", err)
	}
	mark("tcp22")
	var cl *ssh.Client
	if err := poll(ctx, func() error {
		var err error
		cl, err = dialGuest(ctx, addr, p.Image.Username, signer, filepath.Join(dir, "guest_host_key"))
		return err
	}); err != nil {
		return fail("ssh", err)
	}
	defer cl.Close()
	mark("ssh")
	check := "if command -v cloud-init >/dev/null 2>&1; then cloud-init status --wait >/dev/null || exit 3; fi; test -f " + ReadyMarker
	if err := poll(ctx, func() error { _, err := runSSH(cl, check); return err }); err != nil {
		return fail("ready_marker", err)
	}
	mark("ready")
	if p.Profile.GPUCount > 0 {
		if h.cfg.Lab {
			stages = append(stages, "nvidia-smi skipped: lab host")
		} else {
			outb, err := runSSH(cl, "nvidia-smi -L")
			if err != nil {
				return fail("nvidia_smi", fmt.Errorf("%v: %s", err, outb))
			}
			if n := strings.Count(string(outb), "GPU "); n < p.Profile.GPUCount {
				return fail("nvidia_smi", fmt.Errorf("guest sees %d GPUs, the profile has %d", n, p.Profile.GPUCount))
			}
			mark("nvidia-smi")
		}
	}
	return strings.Join(stages, ", "), nil
}

// poll retries fn every 500 ms until it succeeds or ctx ends (returning fn's last error).
func poll(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// probe is the best-effort performance snapshot of the guest: CPUs and memory, and the GPU
// check (gpuCheck) that an image's smoke test shows as its GPU evidence.
func (h *Host) probe(ctx context.Context, p *task.VMProvision, signer ssh.Signer, dir string) string {
	addr := net.JoinHostPort(p.Bundles[0].PrivateIP, strconv.Itoa(h.cfg.GuestSSHPort))
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cl, err := dialGuest(cctx, addr, p.Image.Username, signer, filepath.Join(dir, "guest_host_key"))
	if err != nil {
		return "best effort, not measured: " + err.Error()
	}
	defer cl.Close()
	out, err := runSSH(cl, "echo cpus=$(grep -c ^processor /proc/cpuinfo) mem_kb=$(sed -n 's/^MemTotal: *\\([0-9]*\\).*/\\1/p' /proc/meminfo)")
	if err != nil {
		return "best effort, not measured: " + err.Error()
	}
	detail := strings.Join(strings.Fields(guestText(out)), " ")
	if h.cfg.Lab {
		return detail + "; " + gpuCheck(len(p.Bundles), true, "", nil)
	}
	gpus, err := runSSH(cl, "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader")
	return detail + "; " + gpuCheck(len(p.Bundles), false, guestText(gpus), err)
}

// guestText is what the guest printed, unable to pose as the host's own gpu_check verdict.
func guestText(b []byte) string { return strings.ReplaceAll(string(b), "gpu_check", "gpu-check") }

// gpuCheck is the probe's GPU line: what nvidia-smi in the guest listed against the slots'
// GPUs, or "no GPU here" on a lab host, whose slots' GPUs are emulated stand-ins (nothing to
// run nvidia-smi against). It always starts "gpu_check " and then ok, failed or none: the
// smoke test of an image reads it as its GPU evidence (docs/images.md).
func gpuCheck(slots int, lab bool, out string, err error) string {
	if lab {
		return "gpu_check none: no GPU here (lab host: the slot's GPU is an emulated stand-in; nvidia-smi not run)"
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if err != nil {
		msg := err.Error()
		if len(lines) > 0 {
			msg += ": " + lines[0]
		}
		return "gpu_check failed: nvidia-smi in the guest: " + msg
	}
	if len(lines) != slots {
		return fmt.Sprintf("gpu_check failed: nvidia-smi in the guest lists %d GPUs, the slice has %d: %s", len(lines), slots, strings.Join(lines, " | "))
	}
	return fmt.Sprintf("gpu_check ok: nvidia-smi lists %d GPUs: %s", len(lines), strings.Join(lines, " | "))
}

var ansiRE = regexp.MustCompile(`\x1b(\[[0-9;=?]*[A-Za-z]|[()][A-Za-z0-9])`)

// tailFile is the last n non-empty lines of a console log, terminal escapes removed, each
// line cut to 200 bytes, joined with " | " ("" if unreadable).
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	b = ansiRE.ReplaceAll(b, nil)
	var lines []string
	for _, l := range strings.FieldsFunc(string(b), func(r rune) bool { return r == '\n' || r == '\r' }) {
		l = strings.TrimSpace(strings.Map(func(r rune) rune {
			if r < 0x20 || r == 0x7f {
				return -1
			}
			return r
		}, l))
		if len(l) > 200 {
			l = l[:200] + "…"
		}
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
