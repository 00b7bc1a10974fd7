package disk

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// loopDevice makes a real loop device over a sparse file (root only; CI runs as root).
func loopDevice(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI must run the loop-device tests as root")
		}
		t.Skip("needs root for loop devices (CI runs this as root)")
	}
	for _, tool := range []string{"losetup", "wipefs", "blkdiscard", "blkid", "blockdev", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (apt-get install util-linux e2fsprogs)", tool)
		}
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	if out, err := exec.Command("truncate", "-s", size, img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v %s", err, out)
	}
	out, err := exec.Command("losetup", "-f", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("losetup unavailable here: %v %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

func sh(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v %s", name, args, err, out)
	}
}

func wiper() Wiper { return Wiper{FS: hostfs.New("/"), Run: hostfs.Exec{}} }

func TestWipeRefusesMountedThenWipesAndVerifies(t *testing.T) {
	dev := loopDevice(t, "64M")
	sh(t, "mkfs.ext4", "-q", dev)
	mnt := t.TempDir()
	sh(t, "mount", dev, mnt)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = exec.Command("umount", mnt).Run()
		}
	})
	if err := os.WriteFile(filepath.Join(mnt, "tenant-data"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := wiper()
	ctx := context.Background()
	if _, err := w.Wipe(ctx, dev, true); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "mounted") {
		t.Fatalf("wipe of a mounted device: %v", err)
	}
	sh(t, "umount", mnt)
	mounted = false

	// Dry run changes nothing.
	ev, err := w.Wipe(ctx, dev, false)
	if err != nil || ev.Applied || !strings.HasPrefix(ev.Method, "dry-run") || ev.Bytes != 64<<20 {
		t.Fatalf("dry run = %+v, %v", ev, err)
	}
	before, err := w.Verify(ctx, dev, ev.Bytes)
	if err != nil || before.Verified || before.SignatureAfter != "ext4" {
		t.Fatalf("before wipe: %+v %v", before, err)
	}

	ev, err = w.Wipe(ctx, dev, true)
	if err != nil || !ev.Verified || ev.SignatureAfter != "" || ev.NonZeroRegions != 0 || ev.SampledBytes < 2<<20 {
		t.Fatalf("wipe = %+v, %v", ev, err)
	}
	if out, err := exec.Command("blkid", "-p", dev).CombinedOutput(); err == nil {
		t.Fatalf("blkid still finds a signature: %s", out)
	}
}

func TestVerifyCatchesLeftoverData(t *testing.T) {
	dev := loopDevice(t, "16M")
	w := wiper()
	ctx := context.Background()
	if ev, err := w.Wipe(ctx, dev, true); err != nil || !ev.Verified {
		t.Fatalf("wipe: %+v %v", ev, err)
	}
	// Tenant data left in the middle of the disk (e.g. a wipe that silently skipped a range).
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("leftover tenant bytes"), (16<<20)*4/9); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ev, err := w.Verify(ctx, dev, 16<<20)
	if err != nil || ev.Verified || ev.NonZeroRegions != 1 {
		t.Fatalf("verify after leftover data = %+v, %v", ev, err)
	}
}

func TestResolveRefusesNonDevicesAndPaths(t *testing.T) {
	w := Wiper{FS: hostfs.New(t.TempDir()), Run: hostfs.Exec{}}
	_ = os.MkdirAll(filepath.Join(w.FS.Root, "dev"), 0o755)
	_ = os.WriteFile(filepath.Join(w.FS.Root, "dev/nvme0n1"), []byte("x"), 0o644)
	_ = os.MkdirAll(filepath.Join(w.FS.Root, "proc"), 0o755)
	_ = os.WriteFile(filepath.Join(w.FS.Root, "proc/mounts"), nil, 0o644)
	for _, dev := range []string{"/dev/nvme0n1", "relative", "/etc/passwd", "/dev/missing"} {
		if _, err := w.Resolve(dev); !errors.Is(err, ErrRefused) {
			t.Fatalf("%s accepted: %v", dev, err)
		}
	}
}
