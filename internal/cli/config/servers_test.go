package config

import (
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
)

// A context may list replicas (server first, then servers); --server repeated or
// comma-separated replaces them; the result is the comma-joined list client.New takes.
func TestServersListInContextsAndFlags(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	writeFile(t, filepath.Join(home, ".config", "gpuaas", "config.yaml"), `current_context: prod
contexts:
  prod:
    server: https://a:1
    servers: [https://b:2, https://c:3]
    token: tok
  lb:
    server: https://lb:443
    token: tok
`)
	get := env{"HOME": home}.get
	c, err := Load(Flags{}, get)
	if err != nil || c.Server != "https://a:1,https://b:2,https://c:3" {
		t.Fatalf("context with servers: %q %v", c.Server, err)
	}
	if c, err = Load(Flags{Context: "lb"}, get); err != nil || c.Server != "https://lb:443" {
		t.Fatalf("one load-balancer address: %q %v", c.Server, err)
	}
	var f Flags
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Var(ServerFlag{P: &f.Server}, "server", "")
	if err := fs.Parse([]string{"--server", "https://x:1", "--server", "https://y:2,https://z:3"}); err != nil {
		t.Fatal(err)
	}
	if c, err = Load(f, get); err != nil || c.Server != "https://x:1,https://y:2,https://z:3" {
		t.Fatalf("--server list over the context: %q %v", c.Server, err)
	}
	// A file written back keeps the list (set-context, login rewrite it).
	file, err := ReadFile(filepath.Join(home, ".config", "gpuaas", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "config.yaml")
	if err := file.Write(out); err != nil {
		t.Fatal(err)
	}
	again, err := ReadFile(out)
	if err != nil || len(again.Contexts["prod"].Servers) != 2 {
		t.Fatalf("servers lost on rewrite: %+v %v", again.Contexts["prod"], err)
	}
}
