package slicevm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/imagecache"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/task"
)

// stagingDisk is a loop device named /dev/disk/by-id/<name>, as a slot's NVMe is, and the
// /dev path it resolves to. It needs root, losetup and qemu-img (CI has them).
func stagingDisk(t *testing.T, mib int) (link, dev string) {
	t.Helper()
	for _, tool := range []string{"losetup", "qemu-img", "truncate"} {
		if _, err := exec.LookPath(tool); err != nil || os.Geteuid() != 0 {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI must run the staging test as root with %s", tool)
			}
			t.Skipf("staging test needs root and %s", tool)
		}
	}
	file := filepath.Join(t.TempDir(), "disk.img")
	run(t, "truncate", "-s", fmt.Sprintf("%dM", mib), file)
	dev = run(t, "losetup", "-f", "--show", file)
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	link = fmt.Sprintf("/dev/disk/by-id/gpuaas-staging-%d", os.Getpid())
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(link)
	if err := os.Symlink(dev, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(link) })
	return link, dev
}

func headOf(t *testing.T, dev string, n int) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// A warm slot on a lab host with a real (loop) disk: staging refuses a disk a lease holds;
// otherwise it writes the image onto the disk, records it and keeps it in the cache. The
// next provision of the slot takes the record: only the same image on the same disk skips
// the write, and the record is gone after (nothing is trusted twice). A wipe drops it.
func TestStagedImageOnAWipedDiskSkipsOnlyItsOwnWrite(t *testing.T) {
	link, dev := stagingDisk(t, 8)
	data := t.TempDir()
	h := &Host{cfg: HostConfig{Lab: true, DataDir: data, FS: hostfs.New("/"), Run: hostfs.Exec{},
		Leases: &leases.Dir{Path: filepath.Join(data, "leases"), TTL: time.Hour}, Images: &imagecache.Cache{Dir: filepath.Join(data, "slice-images")}}}
	h.cfg.Images.Pinned = h.ImagesInUse
	image := bytes.Repeat([]byte("a raw slice image block "), 40000) // ~0.9 MiB
	src := filepath.Join(t.TempDir(), "image.raw")
	if err := os.WriteFile(src, image, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(image)
	digest := hex.EncodeToString(sum[:])
	const slot = "0b6f8f3e-2f4e-4c65-9d7a-5d7b0c1e2a01"
	p := &task.ImageStage{SlotID: slot, Device: link, AfterWipeProof: 7,
		Image: task.Image{ID: "img-1", Slug: "warm-image", SourceType: "http", SourceRef: "file://" + src, DigestSHA256: digest, Format: "raw"}}
	ctx := context.Background()
	zeros := make([]byte, len(image))

	// Leased to an allocation: the disk is not idle, nothing is written or recorded.
	if _, err := h.cfg.Leases.Acquire(leases.Request{AllocationID: "alloc-live", TaskID: "t", Slots: map[string][]string{slot: {link}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Stage(ctx, p, &Recorder{}); err == nil || !strings.Contains(err.Error(), "leased to allocation alloc-live") {
		t.Fatalf("staging a leased slot: %v", err)
	}
	if !bytes.Equal(headOf(t, dev, len(image)), zeros) {
		t.Fatal("staging wrote a leased disk")
	}
	if _, err := os.Stat(h.stagedPath(slot)); !os.IsNotExist(err) {
		t.Fatalf("a refused staging left a record: %v", err)
	}
	if _, err := h.cfg.Leases.Release("alloc-live", []string{slot}); err != nil {
		t.Fatal(err)
	}

	rec := &Recorder{}
	out, err := h.Stage(ctx, p, rec)
	if err != nil || out.Disk != dev {
		t.Fatalf("staging: %+v %v (phases %+v)", out, err, rec.Phases())
	}
	if !bytes.Equal(headOf(t, dev, len(image)), image) {
		t.Fatal("the staged disk does not hold the image")
	}
	if pins, err := h.ImagesInUse(); err != nil || !pins[digest] {
		t.Fatalf("the staged image is not pinned in the cache: %v %v", pins, err)
	}
	resolved, err := disk.Wiper{FS: h.cfg.FS, Run: h.cfg.Run}.Resolve(link)
	if err != nil {
		t.Fatal(err)
	}

	// The next provision of the slot takes the record: the same image on the same disk skips.
	boot := task.Bundle{SlotID: slot, NVMeDevice: link}
	staged := h.takeStaged([]task.Bundle{boot})
	why := stagedSkip(staged, boot, resolved, digest)
	if !strings.HasPrefix(why, "image staged on this disk after its wipe proof (warm-image, "+resolved) {
		t.Fatalf("skip reason for the staged image: %q", why)
	}
	if other := stagedSkip(staged, boot, resolved, strings.Repeat("0", 64)); other != "" {
		t.Fatalf("another image would skip its write: %q", other)
	}
	if other := stagedSkip(staged, boot, "/dev/loop999", digest); other != "" {
		t.Fatalf("another disk would skip its write: %q", other)
	}
	if again := h.takeStaged([]task.Bundle{boot}); len(again) != 0 {
		t.Fatalf("a record was trusted twice: %+v", again)
	}
	if pins, err := h.ImagesInUse(); err != nil || pins[digest] {
		t.Fatalf("the image is still pinned after the record was taken: %v %v", pins, err)
	}

	// Staged again, then the slot's disk is wiped: the record goes first.
	if _, err := h.Stage(ctx, p, &Recorder{}); err != nil {
		t.Fatal(err)
	}
	h.DropStaged(slot)
	if staged := h.takeStaged([]task.Bundle{boot}); len(staged) != 0 {
		t.Fatalf("a record survived the wipe: %+v", staged)
	}
}
