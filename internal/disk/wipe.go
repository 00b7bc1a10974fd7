// Package disk erases slot disks and proves it: wipe by the slot's destructive_wipe_policy
// (NVMe sanitize or secure-erase format where the policy and controller allow, else
// signatures then blkdiscard's write-zeroes, falling back to a zero fill) and verification
// by reading back (no filesystem or partition-table signature, sampled regions all zero).
// The evidence names the method, the device identity read from the device, the bytes and
// regions read back, tool versions and times. Destructive steps run only when explicitly
// applied and never on a mounted device, the OS disk, or a disk that is not the slot's.
// Every host path and command goes through the host seam.
package disk

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Evidence is what a wipe did and what verification found (stored in task output and audit,
// and signed by hostd as a slot's wipe proof).
type Evidence struct {
	Device         string            `json:"device"`
	Resolved       string            `json:"resolved"`
	Applied        bool              `json:"applied"`
	Policy         string            `json:"policy"`
	Method         string            `json:"method"`
	Identity       Identity          `json:"identity"`
	Bytes          int64             `json:"bytes"`
	DurationMS     int64             `json:"duration_ms"`
	Verified       bool              `json:"verified"`
	SignatureAfter string            `json:"signature_after,omitempty"`
	SampledBytes   int64             `json:"sampled_bytes"`
	Regions        int               `json:"regions"` // regions read back
	NonZeroRegions int               `json:"non_zero_regions"`
	Tools          map[string]string `json:"tools,omitempty"` // tool -> version line
	Steps          []string          `json:"steps,omitempty"` // erase commands run, in order
	StartedAt      time.Time         `json:"started_at,omitzero"`
	FinishedAt     time.Time         `json:"finished_at,omitzero"`
	Error          string            `json:"error,omitempty"`
}

// Wiper wipes and verifies block devices.
type Wiper struct {
	FS  hostfs.FS
	Run hostfs.Runner
	Now func() time.Time
	// Sleep waits between NVMe sanitize progress polls (default time.Sleep).
	Sleep func(time.Duration)
}

// WipeOptions is one slot disk's wipe.
type WipeOptions struct {
	Device   string // /dev/disk/by-id path or /dev node
	Apply    bool   // false: report what would happen
	Policy   string // destructive_wipe_policy; empty: blkdiscard_zero_verify
	Identity string // the slot's recorded disk identity ("serial:...", ...); empty: none recorded
}

// ErrRefused marks a device that must not be touched.
var ErrRefused = errors.New("refused")

// Resolve maps a device path (a /dev/disk/by-id link or a /dev node) to its host device node
// and checks it is a block device that is neither mounted (itself or a partition) nor
// holding a mounted filesystem like the OS disk, nor in use under LVM, LUKS or md.
func (w Wiper) Resolve(dev string) (string, error) {
	if !strings.HasPrefix(dev, "/dev/") {
		return "", fmt.Errorf("%w: %q is not a /dev path", ErrRefused, dev)
	}
	full, err := w.FS.Path(dev)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(full)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrRefused, dev, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		return "", fmt.Errorf("%w: %s (%s) is not a block device", ErrRefused, dev, real)
	}
	rel, err := filepath.Rel(w.FS.Root, real)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("%w: %s resolves outside the host root", ErrRefused, dev)
	}
	hostDev := "/" + rel
	mounted, err := w.mountedUnder(hostDev)
	if err != nil {
		return "", err
	}
	if len(mounted) > 0 {
		return "", fmt.Errorf("%w: %s is mounted (%s): unmount it through the storage transition first; the OS disk is never wiped",
			ErrRefused, hostDev, strings.Join(mounted, ", "))
	}
	if err := w.refuseInUse(hostDev); err != nil {
		return "", err
	}
	return hostDev, nil
}

// mountedUnder lists mounts whose source is dev or one of its partitions (sources are
// resolved, so by-id and by-uuid links count too).
func (w Wiper) mountedUnder(dev string) ([]string, error) {
	b, err := w.FS.ReadFile("/proc/mounts")
	if err != nil {
		return nil, fmt.Errorf("cannot read /proc/mounts (mount state unknown, refusing): %w", err)
	}
	base := filepath.Base(dev)
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !strings.HasPrefix(f[0], "/dev/") {
			continue
		}
		src := f[0]
		if full, err := w.FS.Path(src); err == nil {
			if r, err := filepath.EvalSymlinks(full); err == nil {
				if rel, err := filepath.Rel(w.FS.Root, r); err == nil {
					src = "/" + rel
				}
			}
		}
		sb := filepath.Base(src)
		if src == dev || (strings.HasPrefix(sb, base) && isPartitionSuffix(strings.TrimPrefix(sb, base))) {
			out = append(out, src+" on "+f[1])
		}
	}
	return out, nil
}

func isPartitionSuffix(s string) bool {
	s = strings.TrimPrefix(s, "p")
	_, err := strconv.Atoi(s)
	return s != "" && err == nil
}

// Wipe erases dev (apply) or reports what would happen (dry run) with the default policy,
// then verifies.
func (w Wiper) Wipe(ctx context.Context, dev string, apply bool) (Evidence, error) {
	return w.WipeWith(ctx, WipeOptions{Device: dev, Apply: apply})
}

// WipeWith erases a slot disk by its policy (or reports what would happen), then verifies.
// An unknown policy, a mounted device or a device whose identity is not the slot's is
// refused before anything is written.
func (w Wiper) WipeWith(ctx context.Context, o WipeOptions) (ev Evidence, err error) {
	now := w.Now
	if now == nil {
		now = time.Now
	}
	policy := o.Policy
	if policy == "" {
		policy = task.WipeBlkdiscardZero
	}
	ev = Evidence{Device: o.Device, Applied: o.Apply, Policy: policy, Method: "wipefs+blkdiscard-zeroout"}
	if err := task.CheckWipePolicy(policy); err != nil {
		ev.Error = err.Error()
		return ev, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	resolved, err := w.Resolve(o.Device)
	if err != nil {
		ev.Error = err.Error()
		return ev, err
	}
	ev.Resolved = resolved
	size, err := w.size(ctx, resolved)
	if err != nil {
		ev.Error = err.Error()
		return ev, err
	}
	ev.Bytes = size
	var ctrl *nvmeCtrl
	ev.Identity, ctrl = w.identity(ctx, resolved)
	if err := ev.Identity.Match(o.Identity); err != nil {
		ev.Error = err.Error()
		return ev, fmt.Errorf("%w: %s: %v", ErrRefused, o.Device, err)
	}
	plan := w.plan(ctx, resolved, policy, ctrl)
	if !o.Apply {
		ev.Method = "dry-run: would run " + plan.describe() + ", then verify"
		return ev, nil
	}
	ev.Tools = w.tools(ctx, ctrl != nil)
	ev.StartedAt = now().UTC()
	defer func() { // the end of the erase and its read-back, on every return
		ev.FinishedAt = now().UTC()
		ev.DurationMS = ev.FinishedAt.Sub(ev.StartedAt).Milliseconds()
	}()
	if err := w.erase(ctx, resolved, size, plan, &ev); err != nil {
		ev.Error = err.Error()
		return ev, err
	}
	vev, err := w.Verify(ctx, resolved, size)
	ev.Verified, ev.SignatureAfter, ev.SampledBytes, ev.Regions, ev.NonZeroRegions = vev.Verified, vev.SignatureAfter, vev.SampledBytes, vev.Regions, vev.NonZeroRegions
	if err != nil {
		ev.Error = err.Error()
		return ev, err
	}
	if !ev.Verified {
		ev.Error = "verification failed: the device still holds data"
	}
	return ev, nil
}

// zeroErase is the erase every policy can fall back to: signatures, then write-zeroes (a
// zero fill where the device cannot).
func (w Wiper) zeroErase(ctx context.Context, dev string, size int64, ev *Evidence) error {
	ev.Method = "wipefs+blkdiscard-zeroout"
	ev.Steps = append(ev.Steps, "wipefs -a "+dev)
	if _, err := w.Run.Run(ctx, "wipefs", "-a", dev); err != nil {
		return fmt.Errorf("wipefs: %w", err)
	}
	ev.Steps = append(ev.Steps, "blkdiscard -z "+dev)
	if _, err := w.Run.Run(ctx, "blkdiscard", "-z", dev); err != nil {
		// Write-zeroes unsupported: zero-fill the whole device.
		ev.Method = "wipefs+zero-fill"
		ev.Steps = append(ev.Steps, "zero fill "+dev)
		if ferr := w.zeroFill(dev, size); ferr != nil {
			return fmt.Errorf("zero fill after blkdiscard failed (%v): %w", err, ferr)
		}
	}
	return nil
}

func (w Wiper) size(ctx context.Context, dev string) (int64, error) {
	out, err := w.Run.Run(ctx, "blockdev", "--getsize64", dev)
	if err != nil {
		return 0, fmt.Errorf("blockdev: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("blockdev reported size %q", strings.TrimSpace(string(out)))
	}
	return n, nil
}

func (w Wiper) zeroFill(dev string, size int64) error {
	full, err := w.FS.Path(dev)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(full, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	for off := int64(0); off < size; {
		n := int64(len(buf))
		if size-off < n {
			n = size - off
		}
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			return err
		}
		off += n
	}
	return f.Sync()
}

// Verify probes for any remaining signature (Probe: a failed probe is an error) and reads sampled
// regions — the first and last MiB and eight regions between — which must be all zero.
func (w Wiper) Verify(ctx context.Context, dev string, size int64) (Evidence, error) {
	ev := Evidence{Device: dev, Resolved: dev, Bytes: size}
	full, err := w.FS.Path(dev)
	if err != nil {
		return ev, err
	}
	sigs, err := Probe(ctx, w.Run, full)
	if err != nil {
		return ev, err
	}
	ev.SignatureAfter = Describe(sigs)
	f, err := os.Open(full)
	if err != nil {
		return ev, err
	}
	defer f.Close()
	const mib = 1 << 20
	regions := [][2]int64{{0, min(mib, size)}, {max(0, size-mib), size}}
	for i := int64(1); i <= 8; i++ {
		off := size * i / 9
		regions = append(regions, [2]int64{off, min(off+64<<10, size)})
	}
	buf := make([]byte, mib)
	for _, r := range regions {
		n := r[1] - r[0]
		if n <= 0 {
			continue
		}
		if _, err := f.ReadAt(buf[:n], r[0]); err != nil && !errors.Is(err, io.EOF) {
			return ev, fmt.Errorf("reading back %s at %d: %w", dev, r[0], err)
		}
		ev.SampledBytes += n
		ev.Regions++
		if !allZero(buf[:n]) {
			ev.NonZeroRegions++
		}
	}
	ev.Verified = ev.SignatureAfter == "" && ev.NonZeroRegions == 0
	return ev, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
