package disk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuaas/gpuaas/internal/disk/disktest"
	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// TestDiskInUseIsRefused: a disk whose partition carries the root filesystem's LVM volume is
// the OS disk even though /proc/mounts names only /dev/mapper/vg-root; the storage
// transition and the wipe refuse it, naming the holder, and write nothing. The host tree
// holds a real block device node (a loop device's), and its sysfs holders link is simulated:
// this kernel has no device-mapper to stack a real volume on it.
func TestDiskInUseIsRefused(t *testing.T) {
	ctx := context.Background()
	loop := disktest.Loop(t, 16<<20)
	disktest.Sh(t, "mkfs.ext4", "-q", "-F", loop)
	var st syscall.Stat_t
	if err := syscall.Stat(loop, &st); err != nil {
		t.Fatal(err)
	}
	base := filepath.Base(loop)
	root := t.TempDir()
	for p, c := range map[string]string{
		"proc/mounts": "/dev/mapper/vg-root / ext4 rw 0 0\n",
		"etc/fstab":   "/dev/mapper/vg-root / ext4 defaults 0 1\n",
		"sys/class/block/" + base + "/" + base + "p3/holders/dm-0": "", // simulated: what dm would link
		"sys/class/block/dm-0/dm/name":                             "vg-root\n",
	} {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.MkdirAll(filepath.Join(root, "dev"), 0o755)
	// The same name as on the host, so a command that wrongly ran would hit only this loop device.
	if err := syscall.Mknod(filepath.Join(root, "dev", base), syscall.S_IFBLK|0o600, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	w := Wiper{FS: hostfs.New(root), Run: hostfs.Exec{}}
	dev := "/dev/" + base
	res, err := w.Transition(ctx, TransitionOptions{Devices: []string{dev}, NodeName: "n", Confirm: "n", Apply: true})
	if !errors.Is(err, ErrRefused) || len(res.Devices) != 1 ||
		!strings.Contains(res.Devices[0].Refused, "in use ("+base+"p3 by dm-0 (vg-root))") {
		t.Fatalf("transition of a disk under the root LVM volume = %+v, %v", res, err)
	}
	if _, err := w.Wipe(ctx, dev, true); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("wipe of a disk under the root LVM volume: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/fstab")); string(b) != "/dev/mapper/vg-root / ext4 defaults 0 1\n" {
		t.Fatalf("fstab changed: %q", b)
	}
	if sigs, err := Probe(ctx, hostfs.Exec{}, loop); err != nil || !hasType(sigs, "ext4") {
		t.Fatalf("the disk was written: %+v, %v", sigs, err)
	}
}
