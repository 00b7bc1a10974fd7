// Package hostfs is the host seam: every read of sysfs, /proc, /dev, /etc and
// /var/lib/gpuaas goes through an FS rooted at --host-root, so the same daemon runs on a
// real host (root "/") and on fixture trees in tests and demos. (Commands get their runner
// here too when a runtime first needs one.)
package hostfs

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// FS is a host filesystem rooted at Root.
type FS struct{ Root string }

// New returns an FS rooted at root ("" means "/").
func New(root string) FS {
	if root == "" {
		root = "/"
	}
	return FS{Root: filepath.Clean(root)}
}

// Path maps an absolute host path into the root. Paths must be absolute and may not climb
// out of the root.
func (f FS) Path(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("hostfs: %q is not an absolute host path", p)
	}
	clean := filepath.Clean(p)
	if strings.Contains(clean, "..") {
		return "", fmt.Errorf("hostfs: %q escapes the host root", p)
	}
	return filepath.Join(f.Root, clean), nil
}

// ReadFile reads a host file.
func (f FS) ReadFile(p string) ([]byte, error) {
	full, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(full)
}

// Exists reports whether a host path exists.
func (f FS) Exists(p string) bool {
	full, err := f.Path(p)
	if err != nil {
		return false
	}
	_, err = os.Stat(full)
	return err == nil
}

// ReadDir lists a host directory.
func (f FS) ReadDir(p string) ([]fs.DirEntry, error) {
	full, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	return os.ReadDir(full)
}

// Readlink returns a host symlink's target as stored.
func (f FS) Readlink(p string) (string, error) {
	full, err := f.Path(p)
	if err != nil {
		return "", err
	}
	return os.Readlink(full)
}

// LinkBase returns the last element of a symlink's target (sysfs links name devices, drivers
// and groups by their last element); "" when p is not a symlink.
func (f FS) LinkBase(p string) string {
	t, err := f.Readlink(p)
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

// ReadHead reads up to n bytes from the start of a host file or block device.
func (f FS) ReadHead(p string, n int) ([]byte, error) {
	full, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	fh, err := os.Open(full)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	buf := make([]byte, n)
	m, err := io.ReadFull(fh, buf)
	if err != nil && m == 0 {
		return nil, err
	}
	return buf[:m], nil
}

// Glob matches a host path pattern and returns host paths (without the root).
func (f FS) Glob(pattern string) ([]string, error) {
	full, err := f.Path(pattern)
	if err != nil {
		return nil, err
	}
	matches, err := filepath.Glob(full)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(matches))
	for _, m := range matches {
		rel, err := filepath.Rel(f.Root, m)
		if err != nil {
			return nil, err
		}
		out = append(out, "/"+rel)
	}
	return out, nil
}
