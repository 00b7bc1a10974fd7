package hypervisor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/cloudinit"
	"github.com/gpuaas/gpuaas/internal/domainxml"
)

// connect reaches the real libvirtd (CI installs and starts it; elsewhere the test skips).
func connect(t *testing.T) *Libvirt {
	t.Helper()
	if _, err := os.Stat(DefaultSocket); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must start libvirtd (%s missing)", DefaultSocket)
		}
		t.Skipf("libvirtd not running (%s missing): apt-get install libvirt-daemon-system qemu-system-x86 ovmf; virtlogd -d; libvirtd -d", DefaultSocket)
	}
	h, err := Connect(DefaultSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v %s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// The lab domain (software emulation, loop device as the slot disk, NoCloud seed written in
// Go, UEFI) goes through define -> start -> running -> destroy -> undefine on real libvirt.
func TestLabDomainLifecycleOnRealLibvirt(t *testing.T) {
	h := connect(t)
	for _, f := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("OVMF not installed (apt-get install ovmf): %v", err)
		}
	}
	// qemu runs as libvirt's qemu user: it must traverse to the seed and NVRAM files.
	dir, err := os.MkdirTemp("", "gpuaas-hv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	img := filepath.Join(dir, "disk.img")
	sh(t, "truncate", "-s", "64M", img)
	loop := sh(t, "losetup", "-f", "--show", img)
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	bridge := fmt.Sprintf("gpt%d", os.Getpid()%100000)
	sh(t, "ip", "link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", bridge).Run() })
	sh(t, "ip", "link", "set", bridge, "up")

	files, err2 := cloudinit.Render(cloudinit.Seed{InstanceID: "hvtest", Hostname: "gpuaas-hvtest", Username: "debian", MAC: "52:54:00:fe:00:01",
		SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl t@x"}})
	if err2 != nil {
		t.Fatal(err2)
	}
	iso := filepath.Join(dir, "seed.iso")
	if err := cloudinit.WriteISO(iso, files); err != nil {
		t.Fatal(err)
	}
	nvram := filepath.Join(dir, "VARS.fd")
	sh(t, "cp", "/usr/share/OVMF/OVMF_VARS_4M.fd", nvram)
	name := fmt.Sprintf("gpuaas-slice-hvtest-%d", os.Getpid())
	numa := 0
	x, err := domainxml.Build(domainxml.Spec{Name: name, VCPUs: 1, MemoryMiB: 256, Emulated: true, LabOffloadOff: true,
		Bundles: []domainxml.Bundle{{Disk: loop, NUMANode: &numa}}, SeedISO: iso, MAC: "52:54:00:fe:00:01", Bridge: bridge,
		LoaderPath: "/usr/share/OVMF/OVMF_CODE_4M.fd", NVRAMPath: nvram})
	if err != nil {
		t.Fatal(err)
	}
	xml := string(x)
	t.Cleanup(func() { _ = h.Destroy(name); _ = h.Undefine(name) })
	if err := h.Define(xml); err != nil {
		t.Fatal(err)
	}
	if st, err := h.State(name); err != nil || st != ShutOff {
		t.Fatalf("after define: %s %v", st, err)
	}
	if err := h.Start(name); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.State(name); st != Running {
		t.Fatalf("after start: %s", st)
	}
	if err := h.Start(name); err != nil { // idempotent
		t.Fatalf("second start: %v", err)
	}
	names, err := h.List("gpuaas-slice-")
	if err != nil || !slices.Contains(names, name) {
		t.Fatalf("list = %v %v", names, err)
	}
	if err := h.Destroy(name); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.State(name); st != ShutOff {
		t.Fatalf("after destroy: %s", st)
	}
	if err := h.Undefine(name); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.State(name); st != NotFound {
		t.Fatalf("after undefine: %s", st)
	}
	if err := h.Undefine(name); err != nil { // idempotent
		t.Fatalf("second undefine: %v", err)
	}
	if err := h.Start(name); err == nil {
		t.Fatal("started an undefined domain")
	}
}

// A domain being shut down, paused or crashed still holds its disks: only shut off and
// absent are inactive (the release wipes nothing under an active one).
func TestStateActive(t *testing.T) {
	for st, want := range map[State]bool{Running: true, Paused: true, Other: true, ShutOff: false, NotFound: false} {
		if st.Active() != want {
			t.Errorf("%s.Active() = %v, want %v", st, st.Active(), want)
		}
	}
}
