package bootstrap

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// recorder stands in for the host's commands: it answers the checks from a fixture state and
// records what applying would run (nothing touches this machine).
type recorder struct {
	installed map[string]bool
	enabled   map[string]bool
	ran       []string
}

func (r *recorder) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	line := name + " " + strings.Join(args, " ")
	switch {
	case name == "dpkg-query":
		if r.installed[args[len(args)-1]] {
			return []byte("install ok installed"), nil
		}
		return nil, &hostfs.ExitError{Cmd: line, Code: 1}
	case name == "systemctl" && args[0] == "is-enabled":
		if r.enabled[args[1]] {
			return []byte("enabled\n"), nil
		}
		return []byte("disabled\n"), &hostfs.ExitError{Cmd: line, Code: 1}
	}
	r.ran = append(r.ran, line)
	return nil, nil
}

func host(t *testing.T) (string, *recorder) {
	t.Helper()
	root := t.TempDir()
	for p, c := range map[string]string{
		"proc/cmdline":                  "BOOT_IMAGE=/vmlinuz root=UUID=x ro quiet\n",
		"proc/cpuinfo":                  "vendor_id\t: GenuineIntel\n",
		"etc/default/grub":              "GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\nGRUB_CMDLINE_LINUX=\"\"\n",
		"etc/dnsmasq.d/gpuaas-old.conf": "dhcp-host=52:54:00:00:00:01,10.100.0.10\n",
	} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "var/lib/libvirt"), 0o700); err != nil {
		t.Fatal(err)
	}
	inst := map[string]bool{}
	for _, p := range Packages {
		inst[p] = true
	}
	inst["openvswitch-switch"], inst["ovmf"] = false, false
	return root, &recorder{installed: inst, enabled: map[string]bool{"nvidia-persistenced.service": true}}
}

func step(r Report, name string) Step {
	for _, s := range r.Steps {
		if s.Name == name {
			return s
		}
	}
	return Step{Name: "missing " + name}
}

func TestPlanApplyResume(t *testing.T) {
	root, run := host(t)
	b := Bootstrapper{FS: hostfs.New(root), Run: run}
	ctx := context.Background()
	plan, err := b.Plan(ctx, Options{HugepagesGiB: 64})
	if err != nil {
		t.Fatal(err)
	}
	if len(run.ran) != 0 {
		t.Fatalf("a plan ran %v", run.ran)
	}
	for name, want := range map[string]string{
		"packages":        "missing: ovmf openvswitch-switch",
		"kernel_args":     "add intel_iommu=on iommu=pt default_hugepagesz=1G hugepagesz=1G hugepages=64",
		"vfio_modules":    "vfio_pci",
		"slice_bridge":    "ovsbr0 10.100.0.1/24 with NAT for 10.100.0.0/24",
		"nvidia_services": "disable nvidia-persistenced.service",
		"libvirt_dir":     "0755",
		"stale_dnsmasq":   "gpuaas-old.conf",
	} {
		if s := step(plan, name); !s.Needed || !strings.Contains(s.Detail, want) {
			t.Errorf("%s: %+v, want needed with %q", name, s, want)
		}
	}
	if !plan.RebootRequired || plan.Ready {
		t.Fatalf("plan: reboot %v ready %v", plan.RebootRequired, plan.Ready)
	}
	grubBefore, _ := os.ReadFile(filepath.Join(root, "etc/default/grub"))

	r, err := b.Apply(ctx, Options{HugepagesGiB: 64})
	if err != nil || !r.Applied || !r.RebootRequired || r.Ready {
		t.Fatalf("apply: %v %+v", err, r)
	}
	grub, _ := os.ReadFile(filepath.Join(root, "etc/default/grub"))
	if !strings.Contains(string(grub), `GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt default_hugepagesz=1G hugepagesz=1G hugepages=64"`) ||
		!strings.Contains(string(grub), `GRUB_CMDLINE_LINUX=""`) || string(grub) == string(grubBefore) {
		t.Fatalf("grub:\n%s", grub)
	}
	ran := strings.Join(run.ran, "\n")
	for _, want := range []string{"apt-get install -y -q --no-install-recommends ovmf openvswitch-switch", "update-grub", "modprobe -a vfio vfio_iommu_type1 vfio_pci",
		"ovs-vsctl --may-exist add-br ovsbr0", "ip addr replace 10.100.0.1/24 dev ovsbr0", "MASQUERADE", "systemctl disable --now nvidia-persistenced.service",
		"install -d -m 0755 /var/lib/libvirt", "rm -f /etc/dnsmasq.d/gpuaas-old.conf"} {
		if !strings.Contains(ran, want) {
			t.Errorf("apply did not run %q:\n%s", want, ran)
		}
	}
	for _, f := range []string{"etc/modules-load.d/gpuaas-vfio.conf", "etc/sysctl.d/60-gpuaas.conf", "var/lib/gpuaas/site-bootstrap/h200-slice-vm.reboot-required", "var/lib/gpuaas/site-bootstrap/last-run.json"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("%s not written: %v", f, err)
		}
	}

	// The host as it is after those commands, before the reboot: files are in place, the
	// kernel arguments wait for the reboot.
	for p := range run.installed {
		run.installed[p] = true
	}
	run.enabled = map[string]bool{}
	_ = os.Chmod(filepath.Join(root, "var/lib/libvirt"), 0o755)
	_ = os.MkdirAll(filepath.Join(root, "sys/class/net/ovsbr0"), 0o755)
	_ = os.Remove(filepath.Join(root, "etc/dnsmasq.d/gpuaas-old.conf"))
	again, _ := b.Plan(ctx, Options{HugepagesGiB: 64})
	for _, s := range again.Steps {
		if s.Needed {
			t.Errorf("after apply %s still needed: %s", s.Name, s.Detail)
		}
	}
	if !again.RebootRequired || again.Ready {
		t.Fatalf("before the reboot: %+v", again)
	}
	// Rebooted with the new arguments: ready, and the marker goes.
	_ = os.WriteFile(filepath.Join(root, "proc/cmdline"), []byte("ro quiet intel_iommu=on iommu=pt default_hugepagesz=1G hugepagesz=1G hugepages=64\n"), 0o644)
	run.ran = nil
	done, err := b.Apply(ctx, Options{HugepagesGiB: 64})
	if err != nil || !done.Ready || done.RebootRequired || len(run.ran) != 0 {
		t.Fatalf("after the reboot: %v %+v ran %v", err, done, run.ran)
	}
	if _, err := os.Stat(filepath.Join(root, "var/lib/gpuaas/site-bootstrap/h200-slice-vm.reboot-required")); !os.IsNotExist(err) {
		t.Fatalf("stale reboot marker: %v", err)
	}
}

func TestAMDBaremetalAndBadOptions(t *testing.T) {
	root, run := host(t)
	_ = os.WriteFile(filepath.Join(root, "proc/cpuinfo"), []byte("vendor_id\t: AuthenticAMD\n"), 0o644)
	b := Bootstrapper{FS: hostfs.New(root), Run: run}
	p, _ := b.Plan(context.Background(), Options{})
	if s := step(p, "kernel_args"); !strings.Contains(s.Detail, "amd_iommu=on iommu=pt") || strings.Contains(s.Detail, "hugepages") {
		t.Fatalf("AMD: %+v", s)
	}
	bm, _ := b.Plan(context.Background(), Options{Profile: "baremetal"})
	if !bm.Ready || len(bm.Steps) != 0 {
		t.Fatalf("baremetal hosts get no slice runtime: %+v", bm)
	}
	for _, o := range []Options{{Profile: "both"}, {BridgeCIDR: "10.100.0.1"}, {Bridge: "br; reboot"}, {HugepagesGiB: -1}} {
		if _, err := b.Plan(context.Background(), o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	// A failing command stops the run and is recorded; the next run plans again.
	failing := &failRunner{recorder: run, fail: "update-grub"}
	b.Run = failing
	if _, err := b.Apply(context.Background(), Options{}); err == nil || !strings.Contains(err.Error(), "kernel_args") {
		t.Fatalf("failing step: %v", err)
	}
}

type failRunner struct {
	*recorder
	fail string
}

func (f *failRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if name == f.fail {
		return nil, &hostfs.ExitError{Cmd: name, Code: 1, Stderr: "boom"}
	}
	return f.recorder.Run(ctx, name, args...)
}
