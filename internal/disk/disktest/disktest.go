// Package disktest gives tests real loop devices carrying each on-disk signature the disk
// probe must find: filesystems, partition tables, LVM2 physical volumes, LUKS headers, mdraid
// members and ZFS members, made with the real tools (mkfs.*, sgdisk/sfdisk, pvcreate,
// cryptsetup, mdadm, zpool). Where this machine's kernel cannot run a tool's create step
// (no md driver, no ZFS module) the signature is written by hand exactly as the on-disk
// format defines it, checked with the real tool that reads it (mdadm --examine; blkid for
// ZFS), and the kind says so in its Made field. Every loop device, volume group and array a
// test makes is removed in t.Cleanup, also when the test fails.
//
// Loop devices need root: without it the tests skip, except under CI (the CI environment
// variable set), where a missing privilege or tool fails the test instead.
package disktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// Kind is one signature a device can carry.
type Kind struct {
	Name string // subtest name: ext4, md-1.0, luks2, ...
	Want string // the type libblkid reports for it
	Size int64  // the loop device's size (each tool's minimum, sparse on disk)
	// make writes the signature onto dev and returns how: "mkfs.ext4", or "hand-made ..."
	// when the machine cannot run the real create step.
	make func(t *testing.T, dev string) string
}

// Made is a device carrying a signature.
type Made struct {
	Dev  string // /dev/loopN
	How  string // the tool that wrote the signature, or "hand-made: ..." and why
	Kind Kind
}

const mib = 1 << 20

// Kinds is every signature the probe must find, in the order tests run them.
var Kinds = []Kind{
	{Name: "ext4", Want: "ext4", Size: 64 * mib, make: tool("mkfs.ext4", "-q", "-F")},
	{Name: "xfs", Want: "xfs", Size: 320 * mib, make: tool("mkfs.xfs", "-q", "-f")},
	{Name: "vfat", Want: "vfat", Size: 64 * mib, make: tool("mkfs.vfat")},
	{Name: "btrfs", Want: "btrfs", Size: 128 * mib, make: tool("mkfs.btrfs", "-q", "-f")},
	{Name: "gpt", Want: "gpt", Size: 64 * mib, make: tool("sgdisk", "-o")},
	{Name: "dos", Want: "dos", Size: 64 * mib, make: dosLabel},
	{Name: "lvm2-pv", Want: "LVM2_member", Size: 64 * mib, make: lvmPV},
	{Name: "luks1", Want: "crypto_LUKS", Size: 64 * mib, make: luks("luks1")},
	{Name: "luks2", Want: "crypto_LUKS", Size: 64 * mib, make: luks("luks2")},
	{Name: "md-0.90", Want: "linux_raid_member", Size: 64 * mib, make: mdMember("0.90")},
	{Name: "md-1.0", Want: "linux_raid_member", Size: 64 * mib, make: mdMember("1.0")},
	{Name: "md-1.1", Want: "linux_raid_member", Size: 64 * mib, make: mdMember("1.1")},
	{Name: "md-1.2", Want: "linux_raid_member", Size: 64 * mib, make: mdMember("1.2")},
	{Name: "zfs", Want: "zfs_member", Size: 128 * mib, make: zfsMember},
}

// Carry makes a loop device of k's size carrying k's signature.
func Carry(t *testing.T, k Kind) Made {
	t.Helper()
	dev := Loop(t, k.Size)
	return Made{Dev: dev, How: k.make(t, dev), Kind: k}
}

var run hostfs.Runner = hostfs.Exec{}

// Need skips the test when a tool is missing (fails it under CI, which installs them all).
func Need(t *testing.T, tools ...string) {
	t.Helper()
	for _, name := range tools {
		if _, err := run.Run(context.Background(), "sh", "-c", `command -v "$0"`, name); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; CI installs it (.ci/deps)", name)
			}
			t.Skipf("%s is not installed (see .ci/deps for the package)", name)
		}
	}
}

// Loop attaches a loop device over a sparse file of size bytes and detaches it at cleanup.
func Loop(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI must run the loop-device tests as root")
		}
		t.Skip("needs root for loop devices (CI runs this as root)")
	}
	Need(t, "losetup", "wipefs", "blkid")
	img := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := run.Run(context.Background(), "losetup", "-f", "--show", img)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("losetup: %v", err)
		}
		t.Skipf("losetup unavailable here: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _, _ = run.Run(context.Background(), "losetup", "-d", dev) })
	return dev
}

// Sh runs a command and fails the test when it fails.
func Sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := run.Run(context.Background(), name, args...)
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return string(out)
}

func tool(name string, args ...string) func(*testing.T, string) string {
	return func(t *testing.T, dev string) string {
		Need(t, name)
		Sh(t, name, append(args, dev)...)
		return strings.Join(append([]string{name}, args...), " ")
	}
}

func dosLabel(t *testing.T, dev string) string {
	Need(t, "sfdisk")
	script := filepath.Join(t.TempDir(), "dos.sfdisk")
	if err := os.WriteFile(script, []byte("label: dos\n,32M,L\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// sfdisk reads its script from stdin; the runner has none, so the shell redirects it.
	Sh(t, "sh", "-c", `sfdisk -q --no-reread "$0" < "$1"`, dev, script)
	return "sfdisk (label: dos, one partition)"
}

func unique(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// lvmPV makes dev a physical volume in a volume group of its own. --devices keeps LVM to
// this one device, so the test never scans or touches the host's other disks.
func lvmPV(t *testing.T, dev string) string {
	Need(t, "pvcreate", "vgcreate", "vgremove", "pvremove")
	vg := unique("gpuaastest")
	t.Setenv("LVM_SUPPRESS_FD_WARNINGS", "1")
	Sh(t, "pvcreate", "-q", "--devices", dev, dev)
	t.Cleanup(func() {
		_, _ = run.Run(context.Background(), "vgremove", "-f", "-q", "--devices", dev, vg)
		_, _ = run.Run(context.Background(), "pvremove", "-f", "-q", "--devices", dev, dev)
	})
	Sh(t, "vgcreate", "-q", "--devices", dev, vg, dev)
	return "pvcreate + vgcreate " + vg
}

// luks formats dev (no mapping is opened, so none is left behind); a cheap PBKDF keeps it fast.
func luks(typ string) func(*testing.T, string) string {
	return func(t *testing.T, dev string) string {
		Need(t, "cryptsetup")
		key := filepath.Join(t.TempDir(), "key")
		if err := os.WriteFile(key, []byte("not-a-secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		Sh(t, "cryptsetup", "luksFormat", "-q", "--type", typ, "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
			"--key-file", key, dev)
		return "cryptsetup luksFormat --type " + typ
	}
}

// mdMember makes dev a member of a two-disk RAID1 (the other disk missing) with the given
// superblock version, with mdadm --create where the kernel has the md driver. Without it
// the superblock is written by hand (mdsuper.go) and mdadm --examine must accept it.
func mdMember(version string) func(*testing.T, string) string {
	return func(t *testing.T, dev string) string {
		Need(t, "mdadm")
		why := "this kernel has no md driver for mdadm --create"
		if _, err := os.Stat("/proc/mdstat"); err == nil {
			ctx := context.Background()
			md := "/dev/md/" + unique("gpuaastest")
			t.Cleanup(func() { _, _ = run.Run(ctx, "mdadm", "--stop", md) })
			_, err := run.Run(ctx, "mdadm", "--create", md, "--run", "--metadata="+version, "--level=1", "--raid-devices=2", dev, "missing")
			if err == nil {
				Sh(t, "mdadm", "--stop", md)
				return "mdadm --create --metadata=" + version
			}
			why = "mdadm --create failed here: " + err.Error()
		}
		writeMDSuperblock(t, dev, version)
		out := Sh(t, "mdadm", "--examine", dev)
		want := "Version : " + version
		if version == "0.90" {
			want = "Version : 0.90.00"
		}
		if !strings.Contains(out, want) {
			t.Fatalf("mdadm --examine does not read the hand-made %s superblock as %q:\n%s", version, want, out)
		}
		return "hand-made md " + version + " superblock (" + why + "); mdadm --examine reads it"
	}
}

// zfsMember makes dev a ZFS pool member with zpool create where ZFS is installed and
// loaded; otherwise it writes the four vdev labels by hand (zfslabel.go).
func zfsMember(t *testing.T, dev string) string {
	if _, err := os.Stat("/dev/zfs"); err == nil {
		if _, err := run.Run(context.Background(), "sh", "-c", "command -v zpool"); err == nil {
			pool := unique("gpuaastest")
			Sh(t, "zpool", "create", "-f", "-o", "cachefile=none", pool, dev)
			t.Cleanup(func() { _, _ = run.Run(context.Background(), "zpool", "destroy", "-f", pool) })
			Sh(t, "zpool", "export", pool)
			return "zpool create " + pool
		}
	}
	writeZFSLabels(t, dev)
	// blkid must read the pool's name out of the label's nvlist, not just see a magic number.
	if out := Sh(t, "blkid", "-p", "-o", "export", dev); !strings.Contains(out, "LABEL=gpuaastest\n") {
		t.Fatalf("blkid does not read the hand-made ZFS label's nvlist:\n%s", out)
	}
	return "hand-made ZFS vdev labels (zfsutils-linux is not installable here); blkid reads the pool name from them"
}
