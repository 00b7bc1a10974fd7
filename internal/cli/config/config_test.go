package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type env map[string]string

func (e env) get(k string) string { return e[k] }

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestPrecedenceFlagOverEnvOverFile(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	writeFile(t, filepath.Join(home, ".config", "gpuaas", "config.yaml"),
		"server: https://file:1\nca_file: ca.crt\ntoken: file-token\n")
	writeFile(t, filepath.Join(home, "env.token"), "env-file-token\n")
	writeFile(t, filepath.Join(home, "flag.token"), "flag-file-token\r\n")

	load := func(e env, f Flags) *Config {
		t.Helper()
		e["HOME"] = home
		c, err := Load(f, e.get)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	c := load(env{}, Flags{})
	if c.Server != "https://file:1" || c.Token != "file-token" || c.CAFile != filepath.Join(home, ".config", "gpuaas", "ca.crt") {
		t.Fatalf("file only: %+v", c)
	}
	if !strings.Contains(c.TokenSource, "config.yaml") {
		t.Fatalf("token source = %q", c.TokenSource)
	}

	c = load(env{"GPUAAS_SERVER": "https://env:2", "GPUAAS_CA_FILE": "/env/ca"}, Flags{})
	if c.Server != "https://env:2" || c.CAFile != "/env/ca" || c.Token != "file-token" {
		t.Fatalf("env over file: %+v", c)
	}

	c = load(env{"GPUAAS_SERVER": "https://env:2"}, Flags{Settings: Settings{Server: "https://flag:3", CAFile: "/flag/ca"}})
	if c.Server != "https://flag:3" || c.CAFile != "/flag/ca" {
		t.Fatalf("flag over env: %+v", c)
	}

	// Token and token file resolve as a pair, by layer.
	c = load(env{"GPUAAS_TOKEN_FILE": filepath.Join(home, "env.token")}, Flags{})
	if c.Token != "env-file-token" || !strings.HasPrefix(c.TokenSource, "GPUAAS_TOKEN_FILE") {
		t.Fatalf("env token file over file token: %+v", c)
	}
	c = load(env{"GPUAAS_TOKEN": "env-token"}, Flags{Settings: Settings{TokenFile: filepath.Join(home, "flag.token")}})
	if c.Token != "flag-file-token" || !strings.HasPrefix(c.TokenSource, "--token-file") {
		t.Fatalf("flag token file over env token: %+v", c)
	}
	c = load(env{"GPUAAS_TOKEN": "env-token", "GPUAAS_TOKEN_FILE": filepath.Join(home, "env.token")}, Flags{})
	if c.Token != "env-token" || c.TokenSource != "GPUAAS_TOKEN" {
		t.Fatalf("within a layer the token beats the token file: %+v", c)
	}
	c = load(env{"GPUAAS_TOKEN": "env-token"}, Flags{Settings: Settings{Token: "flag-token"}})
	if c.Token != "flag-token" || c.TokenSource != "--token" {
		t.Fatalf("flag token: %+v", c)
	}
}

func TestNoFileNoSettings(t *testing.T) {
	t.Parallel()
	c, err := Load(Flags{}, env{"HOME": t.TempDir()}.get)
	if err != nil || c.Server != "" || c.Token != "" || c.TokenSource != "" {
		t.Fatalf("empty: %+v, %v", c, err)
	}
}

func TestXDGConfigHome(t *testing.T) {
	t.Parallel()
	xdg := t.TempDir()
	writeFile(t, filepath.Join(xdg, "gpuaas", "config.yaml"), "server: https://xdg:1\n")
	c, err := Load(Flags{}, env{"HOME": t.TempDir(), "XDG_CONFIG_HOME": xdg}.get)
	if err != nil || c.Server != "https://xdg:1" {
		t.Fatalf("xdg: %+v, %v", c, err)
	}
}

func TestBadInputsAreErrors(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	cfg := filepath.Join(home, ".config", "gpuaas", "config.yaml")
	writeFile(t, cfg, "server: https://x:1\nca-file: typo.crt\n")
	if _, err := Load(Flags{}, env{"HOME": home}.get); err == nil || !strings.Contains(err.Error(), "ca-file") {
		t.Fatalf("unknown key accepted: %v", err)
	}
	writeFile(t, cfg, "server: [unclosed\n")
	if _, err := Load(Flags{}, env{"HOME": home}.get); err == nil || !strings.Contains(err.Error(), cfg) {
		t.Fatalf("bad YAML: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty.token")
	writeFile(t, empty, "\n")
	if _, err := Load(Flags{Settings: Settings{TokenFile: empty}}, env{"HOME": t.TempDir()}.get); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty token file: %v", err)
	}
	if _, err := Load(Flags{Settings: Settings{TokenFile: "/nonexistent/tok"}}, env{"HOME": t.TempDir()}.get); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Fatalf("missing token file: %v", err)
	}
}

func TestContexts(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	path := filepath.Join(home, ".config", "gpuaas", "config.yaml")
	writeFile(t, path, `current_context: prod
contexts:
  prod:
    server: https://prod:1
    ca_file: prod-ca.crt
    token: prod-token
    region: eu-1
  lab:
    server: https://lab:2
    token_file: lab.token
`)
	writeFile(t, filepath.Join(home, ".config", "gpuaas", "lab.token"), "lab-token\n")
	load := func(e env, f Flags) (*Config, error) {
		e["HOME"] = home
		return Load(f, e.get)
	}
	c, err := load(env{}, Flags{})
	if err != nil || c.Context != "prod" || c.Server != "https://prod:1" || c.Token != "prod-token" || c.Region != "eu-1" ||
		c.CAFile != filepath.Join(home, ".config", "gpuaas", "prod-ca.crt") || !strings.Contains(c.TokenSource, `context "prod"`) {
		t.Fatalf("current context: %+v %v", c, err)
	}
	c, err = load(env{"GPUAAS_CONTEXT": "lab"}, Flags{})
	if err != nil || c.Server != "https://lab:2" || c.Token != "lab-token" || c.Region != "" {
		t.Fatalf("GPUAAS_CONTEXT: %+v %v", c, err)
	}
	c, err = load(env{"GPUAAS_CONTEXT": "lab", "GPUAAS_REGION": "us-2"}, Flags{Context: "prod"})
	if err != nil || c.Server != "https://prod:1" || c.Region != "us-2" {
		t.Fatalf("--context over env, GPUAAS_REGION over the file: %+v %v", c, err)
	}
	if _, err := load(env{}, Flags{Context: "nope"}); err == nil || !strings.Contains(err.Error(), "have: lab, prod") {
		t.Fatalf("unknown context: %v", err)
	}

	// Write keeps it 0600 and round-trips; legacy flat keys become the "default" context.
	f := &File{Contexts: map[string]Settings{}, Settings: Settings{Server: "https://old:3", Token: "old"}}
	out := filepath.Join(t.TempDir(), "sub", "config.yaml")
	if err := f.Write(out); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(out)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("config file mode %v", fi.Mode().Perm())
	}
	if di, _ := os.Stat(filepath.Dir(out)); di.Mode().Perm() != 0o700 {
		t.Fatalf("config directory mode %v", di.Mode().Perm())
	}
	back, err := ReadFile(out)
	if err != nil || back.CurrentContext != "default" || back.Contexts["default"].Server != "https://old:3" {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if r := Redacted(Settings{Token: "gpa_0123456789abcdef"}); r.Token != "REDACTED…cdef" {
		t.Fatalf("redacted %q", r.Token)
	}
	writeFile(t, path, "current_context: gone\ncontexts:\n  a:\n    server: https://a:1\n")
	if _, err := load(env{}, Flags{}); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("dangling current_context: %v", err)
	}
}

// TestDottedContextNamesAndBrokenFiles: a context named after an address ("127.0.0.1", what
// login names a context by default) reads back as one context, and a file the CLI refuses
// stops neither flag/environment-only use nor delete-context.
func TestDottedContextNamesAndBrokenFiles(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	path := filepath.Join(home, ".config", "gpuaas", "config.yaml")
	f := &File{CurrentContext: "127.0.0.1", Contexts: map[string]Settings{
		"127.0.0.1": {Server: "https://127.0.0.1:18443", Token: "t1"},
		"prod.eu-1": {Server: "https://prod:1", Token: "t2"},
	}}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	c, err := Load(Flags{}, env{"HOME": home}.get)
	if err != nil || c.Context != "127.0.0.1" || c.Server != "https://127.0.0.1:18443" || c.Token != "t1" {
		t.Fatalf("dotted current context: %+v %v", c, err)
	}
	if c, err = Load(Flags{Context: "prod.eu-1"}, env{"HOME": home}.get); err != nil || c.Server != "https://prod:1" {
		t.Fatalf("dotted --context: %+v %v", c, err)
	}

	writeFile(t, path, "current_context: a.b\ncontexts:\n  a.b:\n    server: https://a:1\n    bogus: 1\n  keep:\n    server: https://k:1\n")
	if _, err := Load(Flags{}, env{"HOME": home}.get); err == nil {
		t.Fatal("a file with an unknown key was accepted")
	}
	c, err = Load(Flags{}, env{"HOME": home, "GPUAAS_SERVER": "https://env:1", "GPUAAS_TOKEN": "e"}.get)
	if err != nil || c.Server != "https://env:1" || !strings.Contains(c.Warning, "bogus") {
		t.Fatalf("environment-only use with a broken file: %+v %v", c, err)
	}
	if _, err := Load(Flags{Context: "keep"}, env{"HOME": home, "GPUAAS_SERVER": "https://env:1"}.get); err == nil {
		t.Fatal("a context was read from a file that was refused")
	}
	if found, err := DeleteContextRaw(path, "a.b"); err != nil || !found {
		t.Fatalf("delete-context on a broken file: %v %v", found, err)
	}
	back, err := ReadFile(path)
	if err != nil || back.CurrentContext != "" || len(back.Contexts) != 1 || back.Contexts["keep"].Server != "https://k:1" {
		t.Fatalf("after the repair: %+v %v", back, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("repaired file mode %v", fi.Mode().Perm())
	}
}
