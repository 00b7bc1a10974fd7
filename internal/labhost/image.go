// Package labhost runs the production host path on emulated hardware: a Debian host VM under
// QEMU (q35, two NUMA nodes, an emulated Intel IOMMU) whose PCIe devices sit on expander
// buses bound to their NUMA node: display controllers standing in for GPUs, NVMe controllers
// as slot disks, and an NVMe controller with SR-IOV virtual functions standing in for the
// fabric NIC's VFs. Inside it gpuaas-hostd runs the libvirt runtime against the guest's real
// kernel: sysfs, IOMMU groups, driver_override, vfio-pci, nvme-cli and libvirtd.
// build.sh is the image recipe (debootstrap from the Debian mirror, cached); Layout is the
// hardware; Machine boots and drives one host.
package labhost

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

//go:embed build.sh
var recipe []byte

// Image is a built host image.
type Image struct {
	RootFS string // raw ext4, booted read-only through a per-run qcow2 overlay
	Kernel string // vmlinuz
	Initrd string
	KVer   string // the Debian kernel release it boots
}

// CacheDir is where Ensure keeps builds: $GPUAAS_LABHOST_CACHE, else /var/cache/gpuaas/lab-host
// (the image is built as root), keyed by the recipe's hash so a changed recipe rebuilds.
func CacheDir() string {
	base := os.Getenv("GPUAAS_LABHOST_CACHE")
	if base == "" {
		base = "/var/cache/gpuaas/lab-host"
	}
	sum := sha256.Sum256(recipe)
	return filepath.Join(base, hex.EncodeToString(sum[:])[:16])
}

// Ensure returns the cached image, building it first when absent (debootstrap: minutes).
func Ensure(ctx context.Context, run hostfs.Runner) (Image, bool, error) {
	dir := CacheDir()
	if img, err := load(dir); err == nil {
		return img, false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Image{}, false, err
	}
	sh := filepath.Join(dir, "build.sh")
	if err := os.WriteFile(sh, recipe, 0o755); err != nil {
		return Image{}, false, err
	}
	if out, err := run.Run(ctx, "bash", sh, dir); err != nil {
		return Image{}, false, fmt.Errorf("labhost: image build failed: %w: %s", err, strings.TrimSpace(string(out)))
	}
	img, err := load(dir)
	return img, true, err
}

func load(dir string) (Image, error) {
	k, err := os.ReadFile(filepath.Join(dir, "kernel"))
	if err != nil {
		return Image{}, err
	}
	img := Image{RootFS: filepath.Join(dir, "rootfs.img"), Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img"),
		KVer: strings.TrimSpace(string(k))}
	for _, f := range []string{img.RootFS, img.Kernel, img.Initrd} {
		if _, err := os.Stat(f); err != nil {
			return Image{}, err
		}
	}
	return img, nil
}
