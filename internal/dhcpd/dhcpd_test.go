package dhcpd

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

func newServer(t *testing.T, state string) *Server {
	t.Helper()
	s, err := New(Config{Interface: "lo", ServerIP: net.ParseIP("10.100.0.1"), Netmask: net.CIDRMask(24, 32), StateFile: state, LeaseTime: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func discover(t testing.TB, mac string, mt dhcpv4.MessageType, requested net.IP) *dhcpv4.DHCPv4 {
	t.Helper()
	hw, _ := net.ParseMAC(mac)
	mods := []dhcpv4.Modifier{dhcpv4.WithMessageType(mt)}
	if requested != nil {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(requested)))
	}
	req, err := dhcpv4.NewDiscovery(hw, mods...)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestReservationsAnswerOnlyKnownMACsAndPersist(t *testing.T) {
	state := filepath.Join(t.TempDir(), "dhcp", "reservations.json")
	s := newServer(t, state)
	if err := s.Reserve(Reservation{MAC: "52:54:00:01:00:00", IP: "10.100.0.10", Hostname: "gpuaas-a1", AllocationID: "a1"}); err != nil {
		t.Fatal(err)
	}
	offer := s.Reply(discover(t, "52:54:00:01:00:00", dhcpv4.MessageTypeDiscover, nil))
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer || !offer.YourIPAddr.Equal(net.ParseIP("10.100.0.10")) ||
		!offer.Router()[0].Equal(net.ParseIP("10.100.0.1")) || offer.IPAddressLeaseTime(0) != 30*time.Minute {
		t.Fatalf("offer = %v", offer)
	}
	if s.Reply(discover(t, "52:54:00:99:99:99", dhcpv4.MessageTypeDiscover, nil)) != nil {
		t.Fatal("an unknown MAC got an answer")
	}
	if nak := s.Reply(discover(t, "52:54:00:01:00:00", dhcpv4.MessageTypeRequest, net.ParseIP("10.100.0.77"))); nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("request for another address = %v", nak)
	}
	ack := s.Reply(discover(t, "52:54:00:01:00:00", dhcpv4.MessageTypeRequest, net.ParseIP("10.100.0.10")))
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || s.LeaseSeen("52:54:00:01:00:00").IsZero() {
		t.Fatalf("ack = %v", ack)
	}
	fi, err := os.Stat(state)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", fi, err)
	}
	// A restarted hostd still answers the reservation.
	again := newServer(t, state)
	if len(again.Reservations()) != 1 || again.Reply(discover(t, "52:54:00:01:00:00", dhcpv4.MessageTypeDiscover, nil)) == nil {
		t.Fatal("reservation lost across restart")
	}
	// ... and knows the guest holds its lease: a guest that took it before a kill -9 asks
	// again only at renewal (half the lease), so readiness of the adopted VM needs this.
	if got, want := again.LeaseSeen("52:54:00:01:00:00"), s.LeaseSeen("52:54:00:01:00:00").Round(0); !got.Equal(want) {
		t.Fatalf("lease seen after restart = %v, want %v", got, want)
	}
	if err := again.Release("52:54:00:01:00:00"); err != nil || again.Reply(discover(t, "52:54:00:01:00:00", dhcpv4.MessageTypeDiscover, nil)) != nil {
		t.Fatal("released MAC still answered")
	}
	for _, bad := range []Reservation{{MAC: "nope", IP: "10.100.0.11"}, {MAC: "52:54:00:01:00:02", IP: "192.168.1.5"},
		{MAC: "52:54:00:01:00:03", IP: "10.100.0.1"}} {
		if err := again.Reserve(bad); err == nil {
			t.Fatalf("bad reservation %+v accepted", bad)
		}
	}
	_ = again.Reserve(Reservation{MAC: "52:54:00:01:00:04", IP: "10.100.0.20"})
	if err := again.Reserve(Reservation{MAC: "52:54:00:01:00:05", IP: "10.100.0.20"}); err == nil {
		t.Fatal("one address reserved for two MACs")
	}
}

// TestHelperServer is not a test: the real-client test runs it inside the server namespace.
func TestHelperServer(t *testing.T) {
	if os.Getenv("GPUAAS_DHCPD_HELPER") == "" {
		t.Skip("helper process for TestRealDHCPClient")
	}
	s, err := New(Config{Interface: os.Getenv("IFACE"), ServerIP: net.ParseIP("10.100.0.1"), Netmask: net.CIDRMask(24, 32), StateFile: os.Getenv("STATE")})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	if err := s.Listen(); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println("READY")
	_ = s.Serve()
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v %s", name, args, err, out)
	}
}

// A real DHCP client (ISC dhclient) in one network namespace gets its reservation from our
// server in another; an unknown MAC gets nothing.
func TestRealDHCPClient(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI must run the network-namespace DHCP test as root")
		}
		t.Skip("needs root for network namespaces (CI runs this as root)")
	}
	for _, tool := range []string{"ip", "dhclient"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (apt-get install iproute2 isc-dhcp-client)", tool)
		}
	}
	id := fmt.Sprintf("%d", os.Getpid()%100000)
	srvNS, cliNS := "gpd-s"+id, "gpd-c"+id
	run(t, "ip", "netns", "add", srvNS)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", srvNS).Run() })
	run(t, "ip", "netns", "add", cliNS)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", cliNS).Run() })
	run(t, "ip", "link", "add", "gvs"+id, "type", "veth", "peer", "name", "gvc"+id)
	run(t, "ip", "link", "set", "gvs"+id, "netns", srvNS)
	run(t, "ip", "link", "set", "gvc"+id, "netns", cliNS)
	run(t, "ip", "-n", srvNS, "addr", "add", "10.100.0.1/24", "dev", "gvs"+id)
	run(t, "ip", "-n", srvNS, "link", "set", "gvs"+id, "up")
	run(t, "ip", "-n", cliNS, "link", "set", "gvc"+id, "address", "52:54:00:01:00:07")
	run(t, "ip", "-n", cliNS, "link", "set", "gvc"+id, "up")
	if _, err := exec.LookPath("ethtool"); err == nil { // LAB.md: offloads drop DHCP on veths
		_ = exec.Command("ip", "netns", "exec", srvNS, "ethtool", "-K", "gvs"+id, "tx", "off").Run()
		_ = exec.Command("ip", "netns", "exec", cliNS, "ethtool", "-K", "gvc"+id, "tx", "off").Run()
	}

	dir := t.TempDir()
	state := filepath.Join(dir, "reservations.json")
	seed := newServer(t, state)
	if err := seed.Reserve(Reservation{MAC: "52:54:00:01:00:07", IP: "10.100.0.17", AllocationID: "a1"}); err != nil {
		t.Fatal(err)
	}
	helper := exec.Command("ip", "netns", "exec", srvNS, os.Args[0], "-test.run=^TestHelperServer$")
	helper.Env = append(os.Environ(), "GPUAAS_DHCPD_HELPER=1", "IFACE=gvs"+id, "STATE="+state)
	stdout, _ := helper.StdoutPipe()
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := sc.Text(); l == "READY" || strings.HasPrefix(l, "ERROR") {
				ready <- l
				return
			}
		}
		ready <- "helper exited"
	}()
	select {
	case l := <-ready:
		if l != "READY" {
			t.Fatalf("dhcp server: %s", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dhcp server never became ready")
	}

	conf := filepath.Join(dir, "dhclient.conf")
	_ = os.WriteFile(conf, []byte("timeout 10;\nretry 1;\n"), 0o644)
	dhclient := func(lease string) ([]byte, error) {
		return exec.Command("ip", "netns", "exec", cliNS, "dhclient", "-1", "-v", "-cf", conf, "-sf", "/bin/true",
			"-pf", filepath.Join(dir, "dhclient.pid"), "-lf", lease, "gvc"+id).CombinedOutput()
	}
	lease := filepath.Join(dir, "known.leases")
	if out, err := dhclient(lease); err != nil {
		t.Fatalf("dhclient with a reserved MAC: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(lease)
	if !strings.Contains(string(b), "fixed-address 10.100.0.17;") || !strings.Contains(string(b), "option routers 10.100.0.1;") {
		t.Fatalf("lease = %s", b)
	}
	_ = exec.Command("ip", "netns", "exec", cliNS, "dhclient", "-x", "-pf", filepath.Join(dir, "dhclient.pid")).Run()

	run(t, "ip", "-n", cliNS, "link", "set", "gvc"+id, "address", "52:54:00:0a:0b:0c")
	unknown := filepath.Join(dir, "unknown.leases")
	if out, err := dhclient(unknown); err == nil {
		t.Fatalf("an unknown MAC got a lease:\n%s", out)
	}
	if b, _ := os.ReadFile(unknown); strings.Contains(string(b), "fixed-address") {
		t.Fatalf("unknown MAC lease file: %s", b)
	}
}
