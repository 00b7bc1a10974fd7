// Package hostfs is the host seam: every read of sysfs, /proc, /dev, /etc and
// /var/lib/gpuaas goes through an FS rooted at --host-root, so the same daemon runs on a
// real host (root "/") and on fixture trees in tests and demos. (Commands get their runner
// here too when a runtime first needs one.)
package hostfs

import (
	"fmt"
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
