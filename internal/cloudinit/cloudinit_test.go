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

func TestInjectionAndBadInputRefused(t *testing.T) {
	cases := map[string]func(*Seed){
		"hostname newline":   func(s *Seed) { s.Hostname = "a\nruncmd: [reboot]" },
		"key newline":        func(s *Seed) { s.SSHPublicKeys = []string{key + "\nruncmd: [reboot]"} },
		"not a key":          func(s *Seed) { s.SSHPublicKeys = []string{"hello"} },
		"bad user":           func(s *Seed) { s.Username = "root;rm" },
		"bad mac":            func(s *Seed) { s.MAC = "52:54:00:01:00" },
		"instance id slash":  func(s *Seed) { s.InstanceID = "../etc" },
		"token with newline": func(s *Seed) { s.TelemetryToken = "a\nb" },
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
