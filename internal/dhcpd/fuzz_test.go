package dhcpd

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// FuzzReply hands the server arbitrary packets, as they arrive on the bridge. It never
// panics; it answers only a reserved MAC, only with that MAC's address, only a DISCOVER
// (OFFER) or a REQUEST (ACK, or NAK for another address); the answer is a well-formed reply
// to the same transaction; and nothing it receives changes its reservations.
func FuzzReply(f *testing.F) {
	for _, mt := range []dhcpv4.MessageType{dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeInform} {
		for _, want := range []net.IP{nil, net.ParseIP("10.100.0.10"), net.ParseIP("10.100.0.77")} {
			f.Add(discover(f, "52:54:00:01:00:00", mt, want).ToBytes())
		}
	}
	f.Add(discover(f, "52:54:00:99:99:99", dhcpv4.MessageTypeDiscover, nil).ToBytes())
	f.Add([]byte{1, 1, 6, 0})
	s, err := New(Config{Interface: "lo", ServerIP: net.ParseIP("10.100.0.1"), Netmask: net.CIDRMask(24, 32),
		StateFile: filepath.Join(f.TempDir(), "reservations.json")})
	if err != nil {
		f.Fatal(err)
	}
	if err := s.Reserve(Reservation{MAC: "52:54:00:01:00:00", IP: "10.100.0.10", Hostname: "gpuaas-a1", AllocationID: "a1"}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		req, err := dhcpv4.FromBytes(pkt)
		if err != nil {
			return // server4 drops what it cannot parse
		}
		resp := s.Reply(req)
		if rs := s.Reservations(); len(rs) != 1 || rs[0].MAC != "52:54:00:01:00:00" || rs[0].IP != "10.100.0.10" {
			t.Fatalf("a packet changed the reservations: %+v", rs)
		}
		if resp == nil {
			return
		}
		if req.OpCode != dhcpv4.OpcodeBootRequest || req.ClientHWAddr.String() != "52:54:00:01:00:00" {
			t.Fatalf("answered op %v from %s", req.OpCode, req.ClientHWAddr)
		}
		mt := resp.MessageType()
		switch req.MessageType() {
		case dhcpv4.MessageTypeDiscover:
			if mt != dhcpv4.MessageTypeOffer {
				t.Fatalf("DISCOVER answered with %s", mt)
			}
		case dhcpv4.MessageTypeRequest:
			if mt != dhcpv4.MessageTypeAck && mt != dhcpv4.MessageTypeNak {
				t.Fatalf("REQUEST answered with %s", mt)
			}
		default:
			t.Fatalf("%s answered with %s", req.MessageType(), mt)
		}
		if mt != dhcpv4.MessageTypeNak && !resp.YourIPAddr.Equal(net.ParseIP("10.100.0.10")) {
			t.Fatalf("offered %s, not the reserved address", resp.YourIPAddr)
		}
		if resp.TransactionID != req.TransactionID || resp.OpCode != dhcpv4.OpcodeBootReply {
			t.Fatalf("reply xid %s op %s to xid %s", resp.TransactionID, resp.OpCode, req.TransactionID)
		}
		back, err := dhcpv4.FromBytes(resp.ToBytes()) // what handle() puts on the wire
		if err != nil || back.MessageType() != mt || !back.YourIPAddr.Equal(resp.YourIPAddr) {
			t.Fatalf("the reply does not parse back: %v", err)
		}
	})
}
