package bootstrap

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// TestSliceBridgeForReal runs the slice_bridge step on this machine: a private Open vSwitch
// (ovsdb-server + ovs-vswitchd started here, userspace "netdev" datapath: no kernel module),
// the bridge address, forwarding and the NAT rule, then checks them with ip and iptables and
// takes them all down again.
func TestSliceBridgeForReal(t *testing.T) {
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "root")
	}
	for _, tool := range []string{"ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ip", "iptables", "sysctl"} {
		if _, err := exec.LookPath(tool); err != nil {
			miss = append(miss, tool)
		}
	}
	if len(miss) > 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI runs the real bridge test but lacks %v (apt-get install openvswitch-switch iptables)", miss)
		}
		t.Skipf("needs %v (apt-get install openvswitch-switch iptables; root)", miss)
	}
	ctx := context.Background()
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := hostfs.Exec{}.Run(ctx, name, args...)
		if err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		return string(out)
	}
	dir := t.TempDir()
	db := "unix:" + filepath.Join(dir, "db.sock")
	run("ovsdb-tool", "create", filepath.Join(dir, "conf.db"), "/usr/share/openvswitch/vswitch.ovsschema")
	run("ovsdb-server", filepath.Join(dir, "conf.db"), "--remote=p"+db, "--pidfile="+filepath.Join(dir, "db.pid"), "--detach", "--log-file="+filepath.Join(dir, "db.log"), "--unixctl="+filepath.Join(dir, "db.ctl"))
	t.Cleanup(func() { killPidfile(filepath.Join(dir, "db.pid")) })
	run("ovs-vsctl", "--db="+db, "--no-wait", "init")
	run("ovs-vswitchd", db, "--pidfile="+filepath.Join(dir, "vswitchd.pid"), "--detach", "--log-file="+filepath.Join(dir, "vswitchd.log"), "--unixctl="+filepath.Join(dir, "vswitchd.ctl"))
	t.Cleanup(func() { killPidfile(filepath.Join(dir, "vswitchd.pid")) })

	const bridge, cidr, subnet = "gpuaasbt0", "10.100.77.1/24", "10.100.77.0/24"
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	_, sysctlErr := os.Stat(sysctlFile)
	t.Cleanup(func() {
		_, _ = hostfs.Exec{}.Run(ctx, "ovs-vsctl", "--db="+db, "--if-exists", "del-br", bridge)
		_, _ = hostfs.Exec{}.Run(ctx, "iptables", "-t", "nat", "-D", "POSTROUTING", "-s", subnet, "!", "-d", subnet, "-j", "MASQUERADE")
		_ = os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644)
		if os.IsNotExist(sysctlErr) {
			_ = os.Remove(sysctlFile)
		}
	})
	b := Bootstrapper{FS: hostfs.New("/"), Run: hostfs.Exec{}}
	o := Options{Bridge: bridge, BridgeCIDR: cidr, OVSDatapath: "netdev", OVSDB: db, Only: []string{"slice_bridge"}}
	r, err := b.Apply(ctx, o)
	if err != nil {
		t.Fatalf("apply: %v %+v", err, r)
	}
	var addr string
	deadline := time.Now().Add(10 * time.Second)
	for addr == "" && time.Now().Before(deadline) {
		out, err := (hostfs.Exec{}).Run(ctx, "ip", "-4", "addr", "show", bridge)
		if err == nil && strings.Contains(string(out), "10.100.77.1/24") {
			addr = string(out)
			break
		}
		time.Sleep(100 * time.Millisecond) // until the port appears; bounded by the deadline
	}
	if addr == "" {
		t.Fatalf("%s has no 10.100.77.1/24", bridge)
	}
	if out := run("ovs-vsctl", "--db="+db, "get", "bridge", bridge, "datapath_type"); strings.TrimSpace(out) != "netdev" {
		t.Fatalf("datapath %q", out)
	}
	if nat := run("iptables", "-t", "nat", "-S", "POSTROUTING"); !strings.Contains(nat, "-s "+subnet+" ! -d "+subnet+" -j MASQUERADE") {
		t.Fatalf("no NAT rule:\n%s", nat)
	}
	if f, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(string(f)) != "1" {
		t.Fatalf("forwarding is %q", f)
	}
	// Idempotent: applied again, nothing is needed and the NAT rule is not duplicated.
	again, err := b.Plan(ctx, o)
	if err != nil || again.Steps[0].Needed {
		t.Fatalf("second plan: %v %+v", err, again)
	}
	if _, err := b.Apply(ctx, Options{Bridge: bridge, BridgeCIDR: cidr, OVSDatapath: "netdev", OVSDB: db, Only: []string{"slice_bridge"}}); err != nil {
		t.Fatal(err)
	}
	if nat := run("iptables", "-t", "nat", "-S", "POSTROUTING"); strings.Count(nat, "-s "+subnet) != 1 {
		t.Fatalf("NAT rule duplicated:\n%s", nat)
	}
}

func killPidfile(p string) {
	b, err := os.ReadFile(p)
	if err != nil {
		return
	}
	_, _ = hostfs.Exec{}.Run(context.Background(), "kill", strings.TrimSpace(string(b)))
}
