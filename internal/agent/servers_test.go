package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// The config's single `server` keeps working, `servers` adds replicas, and --server
// (repeated or comma-separated) replaces both; anything but https:// is refused.
func TestServerListFromConfigAndFlags(t *testing.T) {
	const ids = "node_id: n1\nca_file: /x/ca\ncert_file: /x/c\nkey_file: /x/k\nsigning_pub_file: /x/p\nruntime: sim\n"
	cases := []struct {
		name, file string
		args       []string
		want       []string
		err        string
	}{
		{name: "single server (as enroll wrote it before replicas)", file: "server: https://lb:8443\n",
			want: []string{"https://lb:8443"}},
		{name: "server and servers", file: "server: https://a:1/\nservers: [https://b:2, 'https://c:3,https://a:1']\n",
			want: []string{"https://a:1", "https://b:2", "https://c:3"}},
		{name: "servers only", file: "servers:\n  - https://b:2\n", want: []string{"https://b:2"}},
		{name: "flags replace the file", file: "server: https://a:1\nservers: [https://b:2]\n",
			args: []string{"--server", "https://x:1", "--server", "https://y:2,https://z:3"},
			want: []string{"https://x:1", "https://y:2", "https://z:3"}},
		{name: "plain http refused", file: "server: https://a:1\nservers: [http://b:2]\n", err: `"http://b:2" must be https`},
		{name: "none", file: "", err: "server is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hostd.yaml")
			if err := os.WriteFile(path, []byte(ids+tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
			BindRunFlags(fs)
			if err := fs.Parse(append([]string{"--config", path}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			c, err := LoadConfig(fs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("LoadConfig = %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.ServerList(); !slices.Equal(got, tc.want) {
				t.Fatalf("ServerList = %q, want %q", got, tc.want)
			}
		})
	}
}

// Failover moves to the next server once per failure, and concurrent failures of the same
// attempt move it once, not once each.
func TestServersFailover(t *testing.T) {
	s := newServers([]string{"https://a:1", "https://b:2"})
	base, i := s.current()
	if base != "https://a:1" {
		t.Fatalf("current = %s", base)
	}
	first, second := s.failover(i), s.failover(i) // two requests that failed on a
	if !first || !second {
		t.Fatal("failover should report another server")
	}
	if base, _ := s.current(); base != "https://b:2" {
		t.Fatalf("after failing on a: %s, want b (moved once)", base)
	}
	_, i = s.current()
	s.failover(i)
	if base, _ := s.current(); base != "https://a:1" {
		t.Fatalf("after failing on b: %s, want a again", base)
	}
	if newServers([]string{"https://only:1"}).failover(0) {
		t.Fatal("a single server has nowhere to fail over to")
	}
}

// --sim-hold-phase takes only a real provision or release phase, and only on the sim runtime.
func TestSimHoldPhaseValidated(t *testing.T) {
	const ids = "server: https://a:1\nnode_id: n1\nca_file: /x/ca\ncert_file: /x/c\nkey_file: /x/k\nsigning_pub_file: /x/p\n"
	for _, tc := range []struct {
		runtime, hold, err string
	}{
		{"sim", "dhcp_reservation", ""},
		{"sim", "wipe_verify", ""},
		{"sim", "dhcp_reservatio", "must name a slice.vm_provision or slice.vm_release phase"},
		{"sim", "../x\n", "must name"},
		{"lab", "readiness", "needs runtime sim"},
	} {
		path := filepath.Join(t.TempDir(), "hostd.yaml")
		if err := os.WriteFile(path, []byte(ids+"runtime: "+tc.runtime+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		BindRunFlags(fs)
		if err := fs.Parse([]string{"--config", path, "--sim-hold-phase", tc.hold}); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfig(fs)
		if tc.err == "" && (err != nil || c.SimHoldPhase != tc.hold) {
			t.Errorf("hold %q on %s: %v (held %q)", tc.hold, tc.runtime, err, c.SimHoldPhase)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("hold %q on %s: %v, want an error containing %q", tc.hold, tc.runtime, err, tc.err)
		}
	}
}

// A poll never asks for more than the configured wait: at poll_wait's maximum (60s, the
// controller's limit) a jittered wait above it would be refused.
func TestJitterWaitNeverExceedsTheConfiguredWait(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 30 * time.Second, 60 * time.Second} {
		lo := d
		for range 2000 {
			w := jitterWait(d)
			if w > d || w < d-d/5-time.Millisecond {
				t.Fatalf("jitterWait(%s) = %s, want within [%s, %s]", d, w, d-d/5, d)
			}
			lo = min(lo, w)
		}
		if lo > d-d/20 {
			t.Fatalf("jitterWait(%s) never went below %s in 2000 draws: no jitter", d, lo)
		}
	}
}
