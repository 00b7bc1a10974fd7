package disk

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// refuseRunner fails the test if any command runs: a refused device must never reach
// umount, wipefs or blkdiscard.
type refuseRunner struct{ t *testing.T }

func (r refuseRunner) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	r.t.Errorf("ran %s %v for a hostile device", name, args)
	return nil, os.ErrPermission
}

// snapshotTree is every file under root with its content (symlinks by target).
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "-> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			out[rel] = string(b)
		default:
			out[rel] = "dir"
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTransitionHostileDeviceNamesChangeNothing applies storage transitions (confirmed) for
// hostile device names: newlines, traversal, names outside /dev, links that leave /dev, and
// names of devices that do not exist but do appear in fstab. Each is refused, and not one
// file of the host (fstab, backups, manifests) changes; no command runs.
func TestTransitionHostileDeviceNamesChangeNothing(t *testing.T) {
	root := t.TempDir()
	fstab := "UUID=abc / ext4 defaults 0 1\n/dev/sdz /data ext4 defaults 0 2\n/dev/disk/by-id/gone /srv xfs defaults 0 2\n"
	for p, c := range map[string]string{
		"proc/mounts": "/dev/nvme0n1p2 / ext4 rw 0 0\n",
		"etc/fstab":   fstab,
		"etc/shadow":  "root:x:1::::::\n",
	} {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.MkdirAll(filepath.Join(root, "dev/disk/by-id"), 0o755)
	if err := os.Symlink("../../../etc/shadow", filepath.Join(root, "dev/disk/by-id/nvme-evil")); err != nil {
		t.Fatal(err)
	}
	before := snapshotTree(t, root)
	w := Wiper{FS: hostfs.New(root), Run: refuseRunner{t}}
	for _, dev := range []string{
		"/dev/sdz",                            // in fstab, but no such device: its line must stay
		"/dev/disk/by-id/gone",                // likewise, through a by-id name
		"/dev/sdz\n/dev/nvme0n1p2 / ext4 rw",  // newline injection
		"/dev/sdz /data",                      // a field separator
		"/dev/../etc/fstab",                   // traversal
		"/dev/disk/by-id/../../../etc/shadow", // traversal through by-id
		"/dev/disk/by-id/nvme-evil",           // a link that leaves /dev
		"/etc/fstab",                          // not a device path
		"dev/sdz",                             // relative
		"",                                    // empty
	} {
		res, err := w.Transition(context.Background(), TransitionOptions{Devices: []string{dev}, NodeName: "n", Confirm: "n", Apply: true,
			ManifestDir: "/var/log/gpuaas"})
		if err == nil || len(res.Devices) != 1 || res.Devices[0].Refused == "" || res.FstabBackup != "" || res.Manifest != "" {
			t.Errorf("%q: not refused: %v %+v", dev, err, res)
		}
		if ev, err := w.Wipe(context.Background(), dev, true); err == nil || ev.Verified {
			t.Errorf("%q: wipe not refused: %+v", dev, ev)
		}
	}
	after := snapshotTree(t, root)
	for p, c := range before {
		if after[p] != c {
			t.Errorf("%s changed: %q -> %q", p, c, after[p])
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s was created", p)
		}
	}
}
