// Package labguest builds the lab test guest: a Debian kernel and a busybox/dropbear initramfs
// whose /init is a minimal NoCloud consumer (reads the cidata seed, installs the user-data's
// SSH keys, takes its address by DHCP, starts dropbear, writes the slice-ready marker),
// packaged as a unified kernel image on a GPT/FAT32 ESP in a qcow2 disk image: the same chain
// as production (image -> qemu-img onto a raw disk -> UEFI boot from it). Everything comes
// from Debian packages (apt-get download); build.sh is the recipe.
package labguest

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

//go:embed build.sh
var script []byte

// Image is a built guest.
type Image struct {
	Path   string // qcow2
	SHA256 string
	Kernel string // the Debian kernel package it boots
}

// CacheDir is where Ensure keeps builds: $GPUAAS_LAB_CACHE, else the user cache dir, keyed
// by the recipe's hash so a changed recipe rebuilds.
func CacheDir() (string, error) {
	base := os.Getenv("GPUAAS_LAB_CACHE")
	if base == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		base = filepath.Join(c, "gpuaas", "labguest")
	}
	sum := sha256.Sum256(script)
	return filepath.Join(base, hex.EncodeToString(sum[:])[:16]), nil
}

// Ensure returns the cached guest, building it first when absent.
func Ensure(ctx context.Context, run hostfs.Runner) (Image, error) {
	dir, err := CacheDir()
	if err != nil {
		return Image{}, err
	}
	if img, err := load(dir); err == nil {
		return img, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Image{}, err
	}
	sh := filepath.Join(dir, "build.sh")
	if err := os.WriteFile(sh, script, 0o755); err != nil {
		return Image{}, err
	}
	if _, err := run.Run(ctx, "bash", sh, dir); err != nil {
		return Image{}, fmt.Errorf("labguest: build failed: %w", err)
	}
	return load(dir)
}

func load(dir string) (Image, error) {
	sum, err := os.ReadFile(filepath.Join(dir, "guest.sha256"))
	if err != nil {
		return Image{}, err
	}
	k, _ := os.ReadFile(filepath.Join(dir, "kernel"))
	img := Image{Path: filepath.Join(dir, "guest.qcow2"), SHA256: strings.TrimSpace(string(sum)), Kernel: strings.TrimSpace(string(k))}
	if len(img.SHA256) != 64 {
		return Image{}, fmt.Errorf("labguest: %s: bad digest file", dir)
	}
	if _, err := os.Stat(img.Path); err != nil {
		return Image{}, err
	}
	return img, nil
}

// Missing lists what booting a lab VM needs and this machine lacks: root, libvirtd answering
// on its socket, QEMU and OVMF, the tools that build the guest, and any extra tools the
// caller uses. Empty: the lab can run.
func Missing(extra ...string) []string {
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "root (bridges, loop devices, DHCP on port 67)")
	}
	tools := append([]string{"qemu-system-x86_64", "qemu-img", "losetup", "ip", "blkdiscard", "objcopy", "objdump", "sfdisk", "mkfs.vfat", "mcopy", "apt-get"}, extra...)
	for _, t := range tools {
		if !onPath(t) {
			miss = append(miss, t)
		}
	}
	for _, f := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"} {
		if _, err := os.Stat(f); err != nil {
			miss = append(miss, f)
		}
	}
	if c, err := net.DialTimeout("unix", "/run/libvirt/libvirt-sock", time.Second); err != nil {
		miss = append(miss, "a running libvirtd (virtlogd -d; libvirtd -d)")
	} else {
		c.Close()
	}
	return miss
}

func onPath(tool string) bool {
	for _, dir := range filepath.SplitList(os.Getenv("PATH") + ":/usr/sbin:/sbin") {
		if fi, err := os.Stat(filepath.Join(dir, tool)); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return true
		}
	}
	return false
}

// DestroyDomainsUsing stops and undefines the gpuaas domains whose definition names dev: a
// lab run that failed half-way may leave its VM on a loop device, which then stays busy.
func DestroyDomainsUsing(dev string) {
	ctx := context.Background()
	virsh := func(args ...string) ([]byte, error) {
		return hostfs.Exec{}.Run(ctx, "virsh", append([]string{"-c", "qemu:///system"}, args...)...)
	}
	out, err := virsh("list", "--all", "--name")
	if err != nil {
		return
	}
	for _, name := range strings.Fields(string(out)) {
		if !strings.HasPrefix(name, "gpuaas-") {
			continue
		}
		if x, err := virsh("dumpxml", name); err != nil || !strings.Contains(string(x), "'"+dev+"'") && !strings.Contains(string(x), `"`+dev+`"`) {
			continue
		}
		_, _ = virsh("destroy", name)
		_, _ = virsh("undefine", "--nvram", name)
	}
}
