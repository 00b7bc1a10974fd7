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

func TestTransitionDryRunThenApplyOnLoopDevice(t *testing.T) {
	dev := loopDevice(t, "64M")
	sh(t, "mkfs.ext4", "-q", dev)
	mnt := t.TempDir()
	sh(t, "mount", dev, mnt)
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	etc := t.TempDir()
	fstab := filepath.Join(etc, "fstab")
	orig := "UUID=abc / ext4 defaults 0 1\n" + dev + " " + mnt + " ext4 defaults 0 2\n"
	if err := os.WriteFile(fstab, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := t.TempDir()
	w := wiper()
	ctx := context.Background()
	opts := TransitionOptions{Devices: []string{dev}, NodeName: "h200-01", FstabPath: fstab, ManifestDir: logs}

	plan, err := w.Transition(ctx, opts)
	if err != nil || plan.Applied || len(plan.Devices) != 1 || len(plan.Devices[0].Mounts) != 1 || len(plan.Devices[0].FstabLines) != 1 {
		t.Fatalf("plan = %+v, %v", plan, err)
	}
	if b, _ := os.ReadFile(fstab); string(b) != orig {
		t.Fatal("dry run changed fstab")
	}
	if out, _ := exec.Command("findmnt", "-n", mnt).CombinedOutput(); !strings.Contains(string(out), mnt) {
		t.Fatal("dry run unmounted the share")
	}

	opts.Apply = true
	if _, err := w.Transition(ctx, opts); !errors.Is(err, ErrRefused) {
		t.Fatalf("apply without confirmation: %v", err)
	}
	opts.Confirm = "h200-01"
	res, err := w.Transition(ctx, opts)
	if err != nil {
		t.Fatalf("apply: %v (%+v)", err, res)
	}
	ev := res.Devices[0].Evidence
	if ev == nil || !ev.Verified {
		t.Fatalf("evidence = %+v", ev)
	}
	b, _ := os.ReadFile(fstab)
	if !strings.Contains(string(b), "# gpuaas slice storage transition") || !strings.Contains(string(b), "UUID=abc / ext4 defaults 0 1\n") {
		t.Fatalf("fstab after = %q", b)
	}
	if bak, err := os.ReadFile(res.FstabBackup); err != nil || string(bak) != orig {
		t.Fatalf("fstab backup = %q %v", bak, err)
	}
	fi, err := os.Stat(res.Manifest)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("manifest %s: %v", res.Manifest, err)
	}
	if out, _ := exec.Command("findmnt", "-n", mnt).CombinedOutput(); strings.Contains(string(out), mnt) {
		t.Fatal("share still mounted after apply")
	}
}

// The OS disk is refused before anything is touched (fixture host: refusal needs no device).
func TestTransitionRefusesOSDisk(t *testing.T) {
	root := t.TempDir()
	for p, c := range map[string]string{
		"proc/mounts": "/dev/nvme0n1p2 / ext4 rw 0 0\n/dev/nvme0n1p1 /boot/efi vfat rw 0 0\n",
		"etc/fstab":   "/dev/nvme0n1p2 / ext4 defaults 0 1\n",
		"dev/nvme0n1": "", "dev/nvme0n1p1": "", "dev/nvme0n1p2": "",
	} {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		_ = os.WriteFile(filepath.Join(root, p), []byte(c), 0o644)
	}
	w := Wiper{FS: hostfs.New(root), Run: hostfs.Exec{}}
	res, err := w.Transition(context.Background(), TransitionOptions{Devices: []string{"/dev/nvme0n1"}, NodeName: "n", Confirm: "n", Apply: true})
	if !errors.Is(err, ErrRefused) || !strings.Contains(res.Devices[0].Refused, "OS disk") {
		t.Fatalf("OS disk transition: %v %+v", err, res)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/fstab")); strings.Contains(string(b), "gpuaas") {
		t.Fatal("fstab touched despite refusal")
	}
}
