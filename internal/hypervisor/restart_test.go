package hypervisor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/labguest"
)

// One connection keeps working across a libvirtd restart: a domain started before it is
// still seen running through the same Libvirt afterwards (libvirtd is stopped and started
// again for real; the guest lives on), and it can then be stopped and removed.
// The domain is defined and started with virsh, as an operator's would be: a bare stub domain
// started through this package was killed by libvirtd 9.0 while it reconnected ("shutting
// down, reason=daemon"), while slice domains survive it (lab_vm_libvirtd_restart). It
// restarts the machine's libvirtd, so it runs only alone (make lab-libvirtd; CI runs it).
func TestCallsSurviveALibvirtdRestart(t *testing.T) {
	if os.Getenv(labguest.RestartEnv) != "1" {
		t.Skipf("restarts the shared libvirtd: run alone with %s=1 (make lab-libvirtd)", labguest.RestartEnv)
	}
	if _, err := os.Stat(hypervisor.DefaultSocket); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must start libvirtd (%s missing)", hypervisor.DefaultSocket)
		}
		t.Skipf("libvirtd not running (%s missing)", hypervisor.DefaultSocket)
	}
	if _, err := os.Stat(labguest.LibvirtdPIDFile); err != nil {
		t.Fatalf("libvirtd not started with a pid file (%v)", err)
	}
	h, err := hypervisor.Connect(hypervisor.DefaultSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	name := fmt.Sprintf("gpuaas-hvrestart-%d", os.Getpid())
	t.Cleanup(func() {
		_ = exec.Command("virsh", "-c", "qemu:///system", "destroy", name).Run()
		_ = exec.Command("virsh", "-c", "qemu:///system", "undefine", name).Run()
	})
	// A guest with no disk: firmware finds nothing to boot and idles, which is all this needs.
	xml := fmt.Sprintf(`<domain type='qemu'><name>%s</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os></domain>`, name)
	f := filepath.Join(t.TempDir(), "d.xml")
	if err := os.WriteFile(f, []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"define", f}, {"start", name}} {
		if out, err := exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("virsh %v: %v %s", args, err, out)
		}
	}
	if st, err := h.State(name); err != nil || st != hypervisor.Running {
		t.Fatalf("before the restart: %q, %v", st, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := labguest.RestartLibvirtd(ctx); err != nil {
		t.Fatal(err)
	}

	if st, err := h.State(name); err != nil || st != hypervisor.Running {
		t.Fatalf("after the libvirtd restart: state %q, %v (want running, through the same connection)", st, err)
	}
	names, err := h.List("gpuaas-hvrestart-")
	if err != nil || !slices.Contains(names, name) {
		t.Fatalf("after the libvirtd restart: list %q, %v", names, err)
	}
	// libvirtd 9.0 may yet shut the diskless stub down after its restart (see above): a
	// destroy that finds it stopped still got its answer through the reconnected connection.
	if err := h.Destroy(name); err != nil {
		if st, serr := h.State(name); serr != nil || st.Active() {
			t.Fatalf("destroy after the restart: %v (state %q, %v)", err, st, serr)
		}
	}
	if err := h.Undefine(name); err != nil {
		t.Fatal(err)
	}
	if st, err := h.State(name); err != nil || st != hypervisor.NotFound {
		t.Fatalf("after destroy and undefine: %q, %v", st, err)
	}
}
