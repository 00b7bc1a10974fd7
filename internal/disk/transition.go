package disk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
)

// TransitionOptions selects the devices to hand from host/share use to slice ownership.
type TransitionOptions struct {
	Devices     []string // the approved raw devices (/dev/disk/by-id/... or /dev/nvmeXnY)
	Apply       bool     // false: plan only (the default)
	NodeName    string   // the node this host is
	Confirm     string   // must equal NodeName to apply
	FstabPath   string   // default /etc/fstab
	ManifestDir string   // default /var/log/gpuaas
}

// Mount is one mounted filesystem on a device.
type Mount struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

// DevicePlan is what the transition does (or did) to one device.
type DevicePlan struct {
	Device     string      `json:"device"`
	Resolved   string      `json:"resolved"`
	Mounts     []Mount     `json:"mounts,omitempty"`
	FstabLines []string    `json:"fstab_lines,omitempty"`
	Signatures []Signature `json:"signatures"` // what the device holds now (Probe); empty: nothing found
	Actions    []string    `json:"actions"`
	Refused    string      `json:"refused,omitempty"`
	Evidence   *Evidence   `json:"evidence,omitempty"`
}

// TransitionResult is the plan or the outcome, also written as the host manifest.
type TransitionResult struct {
	Node        string       `json:"node"`
	Applied     bool         `json:"applied"`
	At          time.Time    `json:"at"`
	Devices     []DevicePlan `json:"devices"`
	FstabBackup string       `json:"fstab_backup,omitempty"`
	Manifest    string       `json:"manifest,omitempty"`
}

var osMounts = map[string]bool{"/": true, "/boot": true, "/boot/efi": true, "/usr": true, "/var": true}

type mountEntry struct{ src, resolved, target string }

func (w Wiper) resolveDev(p string) string {
	if r, ok := w.resolveExisting(p); ok {
		return r
	}
	return p
}

// resolveExisting is the host path p resolves to, and whether it exists inside the root.
func (w Wiper) resolveExisting(p string) (string, bool) {
	full, err := w.FS.Path(p)
	if err != nil {
		return "", false
	}
	r, err := filepath.EvalSymlinks(full)
	if err != nil {
		return "", false
	}
	rel, err := filepath.Rel(w.FS.Root, r)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return "/" + rel, true
}

func (w Wiper) mountTable() ([]mountEntry, error) {
	b, err := w.FS.ReadFile("/proc/mounts")
	if err != nil {
		return nil, fmt.Errorf("cannot read /proc/mounts: %w", err)
	}
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && strings.HasPrefix(f[0], "/dev/") {
			out = append(out, mountEntry{src: f[0], resolved: w.resolveDev(f[0]), target: f[1]})
		}
	}
	return out, nil
}

// onDevice reports whether a resolved source is dev or one of its partitions.
func onDevice(src, dev string) bool {
	base, sb := filepath.Base(dev), filepath.Base(src)
	return src == dev || (strings.HasPrefix(sb, base) && isPartitionSuffix(strings.TrimPrefix(sb, base)))
}

// Transition plans (or, with Apply and the node name confirmed, performs) the seed-003
// storage transition: probe what each device holds, comment the devices' share entries out
// of fstab (after a backup), unmount their share mounts, wipe signatures and partition
// tables, blkdiscard, verify, and record a manifest. The OS disk, devices that cannot be
// resolved and devices that cannot be probed are refused before anything is touched.
func (w Wiper) Transition(ctx context.Context, o TransitionOptions) (TransitionResult, error) {
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	res := TransitionResult{Node: o.NodeName, Applied: o.Apply, At: now().UTC()}
	if len(o.Devices) == 0 {
		return res, errors.New("no devices: name the approved raw devices")
	}
	if o.Apply && (o.NodeName == "" || o.Confirm != o.NodeName) {
		return res, fmt.Errorf("%w: applying a storage transition destroys data; confirm with the node name", ErrRefused)
	}
	if o.FstabPath == "" {
		o.FstabPath = "/etc/fstab"
	}
	if o.ManifestDir == "" {
		o.ManifestDir = "/var/log/gpuaas"
	}
	mounts, err := w.mountTable()
	if err != nil {
		return res, err
	}
	fstab, _ := w.FS.ReadFile(o.FstabPath)
	lines := strings.Split(string(fstab), "\n")
	comment := map[int]bool{}
	refused := false
	for _, d := range o.Devices {
		p := DevicePlan{Device: d, Resolved: w.resolveDev(d), Signatures: []Signature{}, Actions: []string{}}
		for _, m := range mounts {
			if onDevice(m.resolved, p.Resolved) {
				p.Mounts = append(p.Mounts, Mount{Source: m.src, Target: m.target})
				if osMounts[m.target] {
					p.Refused = fmt.Sprintf("%s is the OS disk (%s mounted at %s): never slice storage", d, m.src, m.target)
				}
			}
		}
		for i, l := range lines {
			f := strings.Fields(l)
			if len(f) < 2 || strings.HasPrefix(f[0], "#") || !strings.HasPrefix(f[0], "/dev/") {
				continue // UUID=/LABEL= entries are matched through their mounts below
			}
			if onDevice(w.resolveDev(f[0]), p.Resolved) {
				comment[i] = true
				p.FstabLines = append(p.FstabLines, l)
			}
		}
		for i, l := range lines {
			f := strings.Fields(l)
			if len(f) >= 2 && !strings.HasPrefix(f[0], "#") && !comment[i] {
				for _, m := range p.Mounts {
					if f[1] == m.Target {
						comment[i] = true
						p.FstabLines = append(p.FstabLines, l)
					}
				}
			}
		}
		// A name that is not a plain /dev path, or that names nothing here, is refused before
		// anything is touched: an fstab line must never be commented out for it.
		if r, ok := w.resolveExisting(d); p.Refused == "" && (task.CheckDevicePath(d) != nil || !ok || !strings.HasPrefix(r, "/dev/")) {
			p.Refused = fmt.Sprintf("%q does not resolve to a device on this host", d)
		}
		if p.Refused == "" {
			if err := w.refuseInUse(p.Resolved); err != nil {
				p.Refused = strings.TrimPrefix(err.Error(), ErrRefused.Error()+": ")
			}
		}
		// Is the disk empty? Every signature libblkid knows counts (LVM PVs, LUKS, RAID and
		// ZFS members, filesystems, partition tables); a device that cannot be probed is
		// refused, since what it holds is unknown.
		if p.Refused == "" {
			full, err := w.FS.Path(p.Resolved)
			if err == nil {
				var sigs []Signature
				sigs, err = Probe(ctx, w.Run, full)
				p.Signatures = append(p.Signatures, sigs...)
			}
			if err != nil {
				p.Refused = err.Error()
			}
		}
		if p.Refused != "" {
			refused = true
			res.Devices = append(res.Devices, p)
			continue
		}
		for _, l := range p.FstabLines {
			p.Actions = append(p.Actions, "comment out fstab entry: "+l)
		}
		for _, m := range p.Mounts {
			p.Actions = append(p.Actions, "umount "+m.Target)
		}
		found := "no signature found"
		if len(p.Signatures) > 0 {
			found = "erases " + Describe(p.Signatures)
		}
		p.Actions = append(p.Actions, "wipefs -a "+p.Resolved+" ("+found+")", "blkdiscard -z "+p.Resolved+" (zero-fill fallback)", "verify: no signature, sampled zeros")
		res.Devices = append(res.Devices, p)
	}
	if refused {
		return res, fmt.Errorf("%w: a listed device must not be transitioned (see the plan)", ErrRefused)
	}
	if !o.Apply {
		return res, nil
	}
	stamp := res.At.Format("20060102T150405Z")
	if len(comment) > 0 {
		backup := o.FstabPath + ".gpuaas-" + stamp + ".bak"
		if err := w.writeHost(backup, fstab, 0o644); err != nil {
			return res, fmt.Errorf("fstab backup: %w", err)
		}
		res.FstabBackup = backup
		idx := make([]int, 0, len(comment))
		for i := range comment {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for _, i := range idx {
			lines[i] = "# gpuaas slice storage transition " + stamp + ": " + lines[i]
		}
		if err := w.writeHost(o.FstabPath, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			return res, fmt.Errorf("fstab: %w", err)
		}
	}
	var firstErr error
	for i := range res.Devices {
		p := &res.Devices[i]
		for _, m := range p.Mounts {
			if _, err := w.Run.Run(ctx, "umount", m.Target); err != nil {
				p.Refused = "umount failed: " + err.Error()
				break
			}
		}
		if p.Refused != "" {
			firstErr = errors.Join(firstErr, errors.New(p.Refused))
			continue
		}
		ev, err := w.Wipe(ctx, p.Device, true)
		p.Evidence = &ev
		if err == nil && !ev.Verified {
			err = errors.New(ev.Error)
		}
		if err != nil {
			firstErr = errors.Join(firstErr, fmt.Errorf("%s: %w", p.Device, err))
		}
	}
	manifest := filepath.Join(o.ManifestDir, "storage-transition-"+stamp+".json")
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := w.writeHost(manifest, b, 0o600); err != nil {
		return res, errors.Join(firstErr, fmt.Errorf("manifest: %w", err))
	}
	res.Manifest = manifest
	return res, firstErr
}

func (w Wiper) writeHost(p string, data []byte, perm os.FileMode) error {
	full, err := w.FS.Path(p)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return err
	}
	tmp := full + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, full)
}
