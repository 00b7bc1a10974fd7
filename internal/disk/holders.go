package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// inUse lists what the kernel has stacked on dev or on one of its partitions — device-mapper
// volumes (LVM logical volumes, open LUKS mappings) and md arrays — as "nvme0n1p3 by dm-0
// (vg-root)", read from sysfs holders. A disk in use that way is not free even when nothing
// of it appears in /proc/mounts: a root filesystem on LVM is mounted from /dev/mapper/...,
// so only its holders tie it to the OS disk.
func (w Wiper) inUse(dev string) ([]string, error) {
	base := filepath.Base(dev)
	dir := "/sys/class/block/" + base
	entries, err := w.FS.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no sysfs entry: not a kernel block device (host trees in tests)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read %s (whether %s is in use is unknown, refusing): %w", dir, dev, err)
	}
	holders := map[string]string{base: dir + "/holders"}
	names := []string{base}
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, base) && isPartitionSuffix(strings.TrimPrefix(n, base)) {
			holders[n] = dir + "/" + n + "/holders"
			names = append(names, n)
		}
	}
	var out []string
	for _, n := range names {
		hs, err := w.FS.ReadDir(holders[n])
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cannot read %s (whether %s is in use is unknown, refusing): %w", holders[n], dev, err)
		}
		for _, h := range hs {
			desc := n + " by " + h.Name()
			if name, err := w.FS.ReadFile("/sys/class/block/" + h.Name() + "/dm/name"); err == nil && len(strings.TrimSpace(string(name))) > 0 {
				desc += " (" + strings.TrimSpace(string(name)) + ")"
			}
			out = append(out, desc)
		}
	}
	return out, nil
}

// refuseInUse is the refusal for a device with holders, or the error reading them.
func (w Wiper) refuseInUse(dev string) error {
	held, err := w.inUse(dev)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if len(held) > 0 {
		return fmt.Errorf("%w: %s is in use (%s): an active LVM volume, open LUKS mapping or RAID array sits on it (the OS disk too when / is on LVM); stop it first",
			ErrRefused, dev, strings.Join(held, ", "))
	}
	return nil
}
