package hostfs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRootedReads(t *testing.T) {
	root := t.TempDir()
	_ = os.MkdirAll(filepath.Join(root, "proc/sys/kernel"), 0o755)
	_ = os.WriteFile(filepath.Join(root, "proc/sys/kernel/hostname"), []byte("fixture\n"), 0o644)
	f := New(root)
	b, err := f.ReadFile("/proc/sys/kernel/hostname")
	if err != nil || string(b) != "fixture\n" {
		t.Fatalf("read = %q %v", b, err)
	}
	if !f.Exists("/proc/sys") || f.Exists("/dev/kvm") {
		t.Fatal("Exists does not follow the root")
	}
	if _, err := f.ReadFile("relative/path"); err == nil {
		t.Fatal("relative path accepted")
	}
	// Cleaning keeps climbing paths inside the root: /../../etc/passwd is root/etc/passwd.
	if p, err := f.Path("/../../etc/passwd"); err != nil || p != filepath.Join(root, "etc/passwd") {
		t.Fatalf("climbing path mapped to %s (%v)", p, err)
	}
	if New("").Root != "/" {
		t.Fatal("empty root is not /")
	}
}
