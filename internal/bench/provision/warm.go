package provision

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/dhcpd"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/imagecache"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/telemetry"
)

// WarmResult is the disk side of provisioning with and without a warm slot, on the lab
// runtime's real commands: a data image of ImageBytes (random bytes, no holes, so nothing
// is skipped by sparseness), a loop device standing in for the slot's NVMe, the host image
// cache, and qemu-img convert. Cold is a provision of a cached image onto a wiped disk;
// Warm the same provision once the image is staged on that disk (the write is skipped);
// Stage is the staging itself, which runs while the slot is idle, after its wipe proof.
type WarmResult struct {
	ImageBytes int64            `json:"image_bytes"`
	CPU        string           `json:"cpu"`
	Cold       []task.Phase     `json:"cold"`
	Warm       []task.Phase     `json:"warm"`
	Stage      []task.Phase     `json:"stage"`
	Hashes     map[string]int64 `json:"cached_file_hashes"` // re-verifications the cache made in each run
	Note       string           `json:"note,omitempty"`
}

// MeasureWarm runs the comparison with an image of gib GiB, generated once into cacheDir and
// reused by later runs. It needs root, losetup, qemu-img and a running libvirtd (the host
// runtime's constructor connects to it); without them Note says why nothing was measured.
func MeasureWarm(ctx context.Context, cacheDir, work string, gib int) (WarmResult, error) {
	r := WarmResult{CPU: cpuModel(), Hashes: map[string]int64{}}
	for _, tool := range []string{"losetup", "qemu-img", "truncate"} {
		if _, err := exec.LookPath(tool); err != nil || os.Geteuid() != 0 {
			r.Note = "not measured: needs root and " + tool
			return r, nil
		}
	}
	if _, err := os.Stat(hypervisor.DefaultSocket); err != nil {
		r.Note = "not measured: libvirtd is not running (" + hypervisor.DefaultSocket + ")"
		return r, nil
	}
	img, digest, size, err := dataImage(cacheDir, gib)
	if err != nil {
		return r, err
	}
	r.ImageBytes = size
	data := filepath.Join(work, "warm")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return r, err
	}
	defer os.RemoveAll(data)
	link, cleanup, err := loopDisk(data, size+64<<20)
	if err != nil {
		return r, err
	}
	defer cleanup()
	hv, err := hypervisor.Connect(hypervisor.DefaultSocket)
	if err != nil {
		r.Note = "not measured: libvirtd: " + err.Error()
		return r, nil
	}
	defer hv.Close()
	srv, err := dhcpd.New(dhcpd.Config{Interface: "gpuaas-none", ServerIP: net.IPv4(10, 100, 0, 1), Netmask: net.CIDRMask(24, 32),
		StateFile: filepath.Join(data, "dhcp", "reservations.json"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return r, err
	}
	cache := &imagecache.Cache{Dir: filepath.Join(data, "slice-images")}
	h, err := slicevm.NewHost(slicevm.HostConfig{Lab: true, DataDir: data, FS: hostfs.New("/"), Run: hostfs.Exec{}, Hypervisor: hv,
		Leases: &leases.Dir{Path: filepath.Join(data, "leases"), TTL: time.Hour}, Images: cache, DHCP: srv,
		Telemetry: telemetry.NewRegistry(), Bridge: "gpuaas-none", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		return r, err
	}
	p := &task.ImageStage{SlotID: "warm-bench-slot", Device: link,
		Image: task.Image{ID: "warm-bench", Slug: fmt.Sprintf("data-%dgib", gib), SourceType: "http", SourceRef: "file://" + img, DigestSHA256: digest, Format: "raw"}}
	// Into the cache first (a provision's first use of an image on a host downloads it; here
	// it is a local copy): the runs below find it cached.
	if _, _, err := cache.Get(ctx, p.Image.SourceRef, digest); err != nil {
		return r, err
	}
	run := func(name string, fn func(*slicevm.Recorder) error) ([]task.Phase, error) {
		before := cache.Hashes()
		rec := &slicevm.Recorder{}
		if err := fn(rec); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		r.Hashes[name] = cache.Hashes() - before
		return rec.Phases(), nil
	}
	// A first write allocates the loop device's backing file, so the runs below all overwrite
	// (a real NVMe has no such first-write cost).
	if _, err := h.Stage(ctx, p, &slicevm.Recorder{}); err != nil {
		return r, err
	}
	h.DropStaged(p.SlotID)
	// Cold: the cached image is checked and written onto the disk (the provision's
	// image_stat_download, image_digest_verify and image_write_convert).
	if r.Cold, err = run("cold", func(rec *slicevm.Recorder) error { return provisionDiskPhases(ctx, h, cache, p, rec, false) }); err != nil {
		return r, err
	}
	if r.Stage, err = run("stage", func(rec *slicevm.Recorder) error { _, err := h.Stage(ctx, p, rec); return err }); err != nil {
		return r, err
	}
	if r.Warm, err = run("warm", func(rec *slicevm.Recorder) error { return provisionDiskPhases(ctx, h, cache, p, rec, true) }); err != nil {
		return r, err
	}
	h.DropStaged(p.SlotID)
	return r, nil
}

// provisionDiskPhases are the provision's disk phases as the lab runtime runs them: the
// cache lookup, the verification before the write, and the write, skipped when warm (the
// provision's own check is slicevm's stagedSkip: the same image on the same disk).
func provisionDiskPhases(ctx context.Context, h *slicevm.Host, cache *imagecache.Cache, p *task.ImageStage, rec *slicevm.Recorder, warm bool) error {
	var path string
	if err := rec.RunDetail("image_stat_download", func() (string, error) {
		var err error
		path, _, err = cache.Get(ctx, p.Image.SourceRef, p.Image.DigestSHA256)
		return "cached", err
	}); err != nil {
		return err
	}
	if err := rec.RunDetail("image_digest_verify", func() (string, error) {
		hashed, err := cache.Verify(p.Image.DigestSHA256)
		return fmt.Sprintf("hashed=%v", hashed), err
	}); err != nil {
		return err
	}
	return rec.RunDetail("image_write_convert", func() (string, error) {
		if warm {
			return "", slicevm.Skip("image staged on this disk after its wipe proof")
		}
		out, err := exec.CommandContext(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", "raw", "-n", path, p.Device).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("qemu-img convert: %v: %s", err, out)
		}
		return "written", nil
	})
}

// dataImage is a raw image of gib GiB of pseudo-random bytes (no holes, incompressible),
// made once under dir and reused: its path, sha256 and size.
func dataImage(dir string, gib int) (path, digest string, size int64, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", 0, err
	}
	path = filepath.Join(dir, fmt.Sprintf("warm-data-%dgib.raw", gib))
	sumPath := path + ".sha256"
	if b, err := os.ReadFile(sumPath); err == nil {
		if fi, err := os.Stat(path); err == nil && fi.Size() == int64(gib)<<30 {
			return path, strings.TrimSpace(string(b)), fi.Size(), nil
		}
	}
	fmt.Printf("provision: generating a %d GiB data image once (%s)...\n", gib, path)
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return "", "", 0, err
	}
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	rng := rand.NewChaCha8([32]byte{'g', 'p', 'u', 'a', 'a', 's'})
	buf := make([]byte, 1<<20)
	for i := 0; i < gib<<10; i++ {
		_, _ = rng.Read(buf)
		if _, err := w.Write(buf); err != nil {
			f.Close()
			return "", "", 0, err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return "", "", 0, err
	}
	if err := f.Close(); err != nil {
		return "", "", 0, err
	}
	digest = hex.EncodeToString(h.Sum(nil))
	if err := os.Rename(path+".tmp", path); err != nil {
		return "", "", 0, err
	}
	return path, digest, int64(gib) << 30, os.WriteFile(sumPath, []byte(digest+"\n"), 0o644)
}

// loopDisk is a loop device over a sparse file of size bytes under dir, named
// /dev/disk/by-id/<name> as a slot's NVMe is; cleanup detaches it.
func loopDisk(dir string, size int64) (link string, cleanup func(), err error) {
	file := filepath.Join(dir, "nvme.img")
	if out, err := exec.Command("truncate", "-s", fmt.Sprint(size), file).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("truncate: %v: %s", err, out)
	}
	out, err := exec.Command("losetup", "-f", "--show", file).Output()
	if err != nil {
		return "", nil, fmt.Errorf("losetup: %w", err)
	}
	dev := strings.TrimSpace(string(out))
	link = fmt.Sprintf("/dev/disk/by-id/gpuaas-warm-bench-%d", os.Getpid())
	_ = os.MkdirAll(filepath.Dir(link), 0o755)
	_ = os.Remove(link)
	if err := os.Symlink(dev, link); err != nil {
		_ = exec.Command("losetup", "-d", dev).Run()
		return "", nil, err
	}
	return link, func() { _ = os.Remove(link); _ = exec.Command("losetup", "-d", dev).Run() }, nil
}

// cpuModel is the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
