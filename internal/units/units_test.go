package units

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func needAnalyze(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI needs systemd-analyze (apt-get install systemd)")
		}
		t.Skip("systemd-analyze not installed (apt-get install systemd)")
	}
}

// verify runs systemd-analyze verify on units copied to a temp dir, with the binaries they
// start pointing at /bin/true (verify insists the executables exist). Any output is a finding:
// systemd-analyze exits 0 even for unknown keys.
func verify(t *testing.T, units map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"gpuaas-hostd", "gpuaas-controller"} {
		if err := os.Symlink("/bin/true", filepath.Join(bin, b)); err != nil {
			t.Fatal(err)
		}
	}
	var paths []string
	for name, text := range units {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(text, "/usr/local/bin/", bin+"/")), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, paths...)...).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil && s == "" {
		s = err.Error()
	}
	return s
}

func shipped(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "..", "systemd", "*.service"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no units in systemd/: %v", err)
	}
	units := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		units[filepath.Base(p)] = string(b)
	}
	return units
}

func TestShippedUnitsVerify(t *testing.T) {
	needAnalyze(t)
	units := shipped(t)
	for _, want := range []string{"gpuaas-controller.service", "gpuaas-hostd.service", "gpuaas-firmware-profile.service", "gpuaas-host-bootstrap.service"} {
		if _, ok := units[want]; !ok {
			t.Errorf("systemd/%s is missing", want)
		}
	}
	if out := verify(t, units); out != "" {
		t.Fatalf("systemd-analyze verify:\n%s", out)
	}
}

func TestValidatorCatchesMistakes(t *testing.T) {
	needAnalyze(t)
	out := verify(t, map[string]string{"broken.service": "[Service]\nType=notify2\nExecStart=/usr/local/bin/gpuaas-hostd run\nWatchdogSecs=1\n"})
	if !strings.Contains(out, "WatchdogSecs") || !strings.Contains(out, "notify2") {
		t.Fatalf("a broken unit passed: %q", out)
	}
}

func TestUnitDirectives(t *testing.T) {
	units := shipped(t)
	want := map[string][]string{
		"gpuaas-hostd.service": {"Type=notify", "WatchdogSec=", "Restart=on-failure", "StateDirectory=gpuaas", "RuntimeDirectory=",
			"After=network-online.target libvirtd.service openvswitch-switch.service", "DeviceAllow=char-vfio rw", "NoNewPrivileges=yes"},
		"gpuaas-controller.service":       {"Type=notify", "EnvironmentFile=", "NoNewPrivileges=yes", "ProtectSystem=strict"},
		"gpuaas-firmware-profile.service": {"Type=oneshot", "gpuaas-hostd firmware-profile apply", "ExecStartPost=/bin/systemctl disable gpuaas-firmware-profile.service", "Before=gpuaas-hostd.service"},
		"gpuaas-host-bootstrap.service":   {"Type=oneshot", "gpuaas-hostd bootstrap --apply", "Before=gpuaas-hostd.service libvirtd.service"},
	}
	for name, ds := range want {
		for _, d := range ds {
			if !strings.Contains(units[name], d) {
				t.Errorf("%s lacks %q", name, d)
			}
		}
	}
}
