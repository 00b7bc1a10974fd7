package cloudinit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl tenant@laptop"

func seed() Seed {
	return Seed{InstanceID: "0c989b43-1027-4099-a9e1-70c9acad3fff", Hostname: "gpuaas-0c989b43", Username: "debian",
		SSHPublicKeys: []string{key}, TerminalKey: key, MAC: "52:54:00:01:00:00", IP: "10.100.0.10", TelemetryToken: "tok_abc"}
}

func needTool(t *testing.T, tool, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs %s (apt-get install %s)", tool, pkg)
		}
		t.Skipf("%s not installed (apt-get install %s)", tool, pkg)
	}
}

func TestRenderPassesCloudInitSchema(t *testing.T) {
	f, err := Render(seed())
	if err != nil {
		t.Fatal(err)
	}
	var ud map[string]any
	if !strings.HasPrefix(string(f.UserData), "#cloud-config\n") || yaml.Unmarshal(f.UserData, &ud) != nil || ud["hostname"] != "gpuaas-0c989b43" {
		t.Fatalf("user-data = %s", f.UserData)
	}
	var md map[string]any
	if yaml.Unmarshal(f.MetaData, &md) != nil || md["instance-id"] != "0c989b43-1027-4099-a9e1-70c9acad3fff" {
		t.Fatalf("meta-data = %s", f.MetaData)
	}
	if !strings.Contains(string(f.NetworkConfig), "macaddress: \"52:54:00:01:00:00\"") {
		t.Fatalf("network-config = %s", f.NetworkConfig)
	}
	needTool(t, "cloud-init", "cloud-init")
	p := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(p, f.UserData, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cloud-init", "schema", "--config-file", p).CombinedOutput(); err != nil {
		t.Fatalf("cloud-init schema rejects our user-data: %v\n%s", err, out)
	}
}

func TestTelemetryHelperAndDriverProfile(t *testing.T) {
	s := seed()
	s.TelemetryURL = "http://10.100.0.1:9110/internal/v1/guest-telemetry"
	s.GuestDriverProfile = "ubuntu_24_04_nvidia_570_server_rdma"
	f, err := Render(s)
	if err != nil {
		t.Fatal(err)
	}
	var ud struct {
		Packages   []string `yaml:"packages"`
		WriteFiles []struct {
			Path, Permissions, Content string
		} `yaml:"write_files"`
		Runcmd [][]string `yaml:"runcmd"`
	}
	if err := yaml.Unmarshal(f.UserData, &ud); err != nil {
		t.Fatal(err)
	}
	if len(ud.Packages) == 0 || ud.Packages[0] != "nvidia-driver-570-server" {
		t.Fatalf("packages %v", ud.Packages)
	}
	paths := map[string]string{}
	for _, w := range ud.WriteFiles {
		paths[w.Path] = w.Permissions
		if w.Path == "/etc/gpuaas/instance.env" && !strings.Contains(w.Content, "GPUAAS_TELEMETRY_URL="+s.TelemetryURL) {
			t.Fatalf("instance.env lacks the telemetry URL: %q", w.Content)
		}
	}
	if paths["/etc/gpuaas/instance.env"] != "0600" || paths["/usr/local/bin/gpuaas-metrics-helper"] != "0755" || paths["/etc/systemd/system/gpuaas-metrics-helper.timer"] == "" {
		t.Fatalf("write_files %v", paths)
	}
	last := ud.Runcmd[len(ud.Runcmd)-1]
	if len(ud.Runcmd) < 3 || !strings.Contains(strings.Join(last, " "), "slice-ready") {
		t.Fatalf("the ready marker must be written last, after the driver install: %v", ud.Runcmd)
	}
	needTool(t, "cloud-init", "cloud-init")
	p := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(p, f.UserData, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cloud-init", "schema", "--config-file", p).CombinedOutput(); err != nil {
		t.Fatalf("cloud-init schema rejects our user-data: %v\n%s\n%s", err, out, f.UserData)
	}
}

func TestInjectionAndBadInputRefused(t *testing.T) {
	cases := map[string]func(*Seed){
		"hostname newline":   func(s *Seed) { s.Hostname = "a\nruncmd: [reboot]" },
		"key newline":        func(s *Seed) { s.SSHPublicKeys = []string{key + "\nruncmd: [reboot]"} },
		"not a key":          func(s *Seed) { s.SSHPublicKeys = []string{"hello"} },
		"bad user":           func(s *Seed) { s.Username = "root;rm" },
		"bad mac":            func(s *Seed) { s.MAC = "52:54:00:01:00" },
		"instance id slash":  func(s *Seed) { s.InstanceID = "../etc" },
		"token with newline": func(s *Seed) { s.TelemetryToken = "a\nb" },
		"telemetry url":      func(s *Seed) { s.TelemetryURL = "http://10.100.0.1:9110/x'; reboot; '" },
		"telemetry scheme":   func(s *Seed) { s.TelemetryURL = "file:///etc/passwd" },
		"driver profile":     func(s *Seed) { s.GuestDriverProfile = "windows_xp" },
	}
	for name, mut := range cases {
		s := seed()
		mut(&s)
		if _, err := Render(s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestSeedDirAndISO(t *testing.T) {
	f, err := Render(seed())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "slices", "a1")
	if err := WriteSeedDir(dir, f); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"user-data", "meta-data", "network-config"} {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", n, fi, err)
		}
	}
	iso := filepath.Join(dir, "seed.iso")
	if err := WriteISO(iso, f); err != nil {
		t.Fatal(err)
	}
	needTool(t, "isoinfo", "genisoimage")
	out, err := exec.Command("isoinfo", "-d", "-i", iso).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Volume id: cidata") {
		t.Fatalf("isoinfo -d: %v %s", err, out)
	}
	got, err := exec.Command("isoinfo", "-i", iso, "-x", "/user-data;1").Output()
	if err != nil || string(got) != string(f.UserData) {
		t.Fatalf("user-data read back from the ISO differs: %v\n%s", err, got)
	}
}

func hostSeed(t *testing.T) HostSeed {
	t.Helper()
	ca := "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUAQIDBAUGBwgJCgsMDQ4PEBESExQwCgYIKoZIzj0EAwIw\n-----END CERTIFICATE-----\n"
	return HostSeed{Node: "h200-01", Profile: ProfileSliceVM, Server: "https://ctl.example:8443", CAPEM: []byte(ca),
		BootstrapToken: "gpb_0123456789abcdefghijkl", NodeTags: []string{"gpuaas-profile-slice-vm", "gpu-nvidia-h200"},
		HostdURL: "https://repo.example/gpuaas-hostd", HostdSHA256: strings.Repeat("ab", 32), FirmwareVersion: "h200-xe9680l-slice-vm-v1",
		FirmwareAttrs: "BIOS.ProcSettings.ProcVirtualization=Enabled BIOS.IntegratedDevices.SriovGlobalEnable=Enabled", ApplyIfNeeded: true,
		RebootOnChange: true, MaxRebootAttempts: 1,
		Units: map[string]string{"gpuaas-hostd.service": "[Unit]\nDescription=h\n", "gpuaas-host-bootstrap.service": "[Unit]\nDescription=b\n", "gpuaas-firmware-profile.service": "[Unit]\nDescription=f\n", "gpuaas-controller.service": "x"}}
}

func TestRenderHostUserData(t *testing.T) {
	for _, profile := range []string{ProfileSliceVM, ProfileBaremetal} {
		h := hostSeed(t)
		h.Profile = profile
		if profile == ProfileBaremetal {
			// A baremetal host does not enroll: user-data with a token for it is refused.
			if _, err := RenderHost(h); err == nil {
				t.Fatal("baremetal user-data accepted a bootstrap token it would never use")
			}
			h.BootstrapToken = ""
		}
		ud, err := RenderHost(h)
		if err != nil {
			t.Fatal(err)
		}
		s := string(ud)
		for _, want := range []string{"GPUAAS_FIRMWARE_PROFILE_TAG=gpuaas-profile-" + profile, "GPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS=1",
			"/etc/systemd/system/gpuaas-firmware-profile.service", "sha256sum -c", "/etc/gpuaas/ca.crt"} {
			if !strings.Contains(s, want) {
				t.Errorf("%s: user-data lacks %q", profile, want)
			}
		}
		if strings.Contains(s, "gpuaas-controller.service") {
			t.Errorf("%s: the controller unit is not a host unit", profile)
		}
		enrolls := strings.Contains(s, "gpb_0123456789abcdefghijkl") && strings.Contains(s, "gpuaas-hostd.service") && strings.Contains(s, "gpuaas-host-bootstrap.service")
		if enrolls != (profile == ProfileSliceVM) {
			t.Errorf("%s: enrollment present = %v", profile, enrolls)
		}
		needTool(t, "cloud-init", "cloud-init")
		p := filepath.Join(t.TempDir(), "user-data")
		if err := os.WriteFile(p, ud, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cloud-init", "schema", "--config-file", p).CombinedOutput(); err != nil {
			t.Fatalf("%s: cloud-init schema rejects the host user-data: %v\n%s\n%s", profile, err, out, ud)
		}
	}
}

func TestRenderHostRefusesBadInput(t *testing.T) {
	cases := map[string]func(*HostSeed){
		"profile":  func(h *HostSeed) { h.Profile = "both" },
		"token":    func(h *HostSeed) { h.BootstrapToken = "gpb_x; reboot" },
		"digest":   func(h *HostSeed) { h.HostdSHA256 = "abc" },
		"url":      func(h *HostSeed) { h.HostdURL = "https://x/a'; rm -rf / #" },
		"server":   func(h *HostSeed) { h.Server = "http://ctl:8443" },
		"ca":       func(h *HostSeed) { h.CAPEM = []byte("not pem") },
		"attrs":    func(h *HostSeed) { h.FirmwareAttrs = "BIOS.A.B=$(reboot)" },
		"version":  func(h *HostSeed) { h.FirmwareVersion = "v1\nGPUAAS_X=1" },
		"tag":      func(h *HostSeed) { h.NodeTags = []string{"Bad Tag"} },
		"units":    func(h *HostSeed) { h.Units = map[string]string{} },
		"reboots":  func(h *HostSeed) { h.MaxRebootAttempts = 9 },
		"http api": func(h *HostSeed) { h.Server = "http://ctl.example" },
	}
	for name, mut := range cases {
		h := hostSeed(t)
		mut(&h)
		if _, err := RenderHost(h); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
