// Package dhcpd is hostd's DHCPv4 server for slice VMs: it answers only reserved MACs with
// their reserved address (router, DNS, lease time) on the slice bridge, and ignores every
// other client. Reservations persist as a 0600 JSON file under the state directory, so they
// survive a hostd restart.
package dhcpd

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
)

// Reservation binds a MAC to an IPv4 address for one allocation.
type Reservation struct {
	MAC          string `json:"mac"`
	IP           string `json:"ip"`
	Hostname     string `json:"hostname,omitempty"`
	AllocationID string `json:"allocation_id"`
	// LastAck is when the client was last acknowledged: kept with the reservation so a
	// restarted hostd still knows a running guest holds its lease (readiness of an adopted
	// domain; a guest renews only at half its 1 h lease).
	LastAck time.Time `json:"last_ack,omitempty"`
}

// Config is the network the server hands out.
type Config struct {
	Interface string        // bridge to serve on
	ServerIP  net.IP        // this host on the bridge (also the router), e.g. 10.100.0.1
	Netmask   net.IPMask    // e.g. /24
	DNS       []net.IP      // defaults to ServerIP
	LeaseTime time.Duration // default 1h
	StateFile string        // reservations, e.g. /var/lib/gpuaas/dhcp/reservations.json
	Logger    *slog.Logger
}

// Server serves reservations.
type Server struct {
	cfg  Config
	mu   sync.RWMutex
	byMA map[string]Reservation
	srv  *server4.Server
	seen map[string]time.Time // MAC -> last ACK (readiness: "DHCP lease seen")
}

// New loads persisted reservations.
func New(cfg Config) (*Server, error) {
	if cfg.ServerIP.To4() == nil || cfg.Netmask == nil || cfg.StateFile == "" {
		return nil, errors.New("dhcpd: server IP, netmask and state file are required")
	}
	if cfg.LeaseTime == 0 {
		cfg.LeaseTime = time.Hour
	}
	if len(cfg.DNS) == 0 {
		cfg.DNS = []net.IP{cfg.ServerIP}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, byMA: map[string]Reservation{}, seen: map[string]time.Time{}}
	b, err := os.ReadFile(cfg.StateFile)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		var rs []Reservation
		if err := json.Unmarshal(b, &rs); err != nil {
			return nil, fmt.Errorf("dhcpd: %s is corrupt: %w", cfg.StateFile, err)
		}
		for _, r := range rs {
			s.byMA[r.MAC] = r
			if !r.LastAck.IsZero() {
				s.seen[r.MAC] = r.LastAck
			}
		}
	}
	return s, nil
}

func (s *Server) persist() error {
	rs := make([]Reservation, 0, len(s.byMA))
	for m, r := range s.byMA {
		r.LastAck = s.seen[m]
		rs = append(rs, r)
	}
	b, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.cfg.StateFile), 0o700); err != nil {
		return err
	}
	tmp := s.cfg.StateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.cfg.StateFile)
}

// Reserve adds (or replaces) a reservation after checking it fits the network and does not
// hand one address to two MACs.
func (s *Server) Reserve(r Reservation) error {
	mac, err := net.ParseMAC(r.MAC)
	if err != nil || len(mac) != 6 {
		return fmt.Errorf("dhcpd: bad MAC %q", r.MAC)
	}
	r.MAC = strings.ToLower(mac.String())
	ip := net.ParseIP(r.IP).To4()
	network := &net.IPNet{IP: s.cfg.ServerIP.Mask(s.cfg.Netmask), Mask: s.cfg.Netmask}
	if ip == nil || !network.Contains(ip) || ip.Equal(s.cfg.ServerIP) {
		return fmt.Errorf("dhcpd: %q is not a free address in %s", r.IP, network)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for m, o := range s.byMA {
		if o.IP == ip.String() && m != r.MAC {
			return fmt.Errorf("dhcpd: %s is already reserved for %s", ip, m)
		}
	}
	r.IP = ip.String()
	s.byMA[r.MAC] = r
	return s.persist()
}

// Release drops a MAC's reservation (idempotent).
func (s *Server) Release(mac string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byMA, strings.ToLower(mac))
	return s.persist()
}

// Reservations lists the current reservations.
func (s *Server) Reservations() []Reservation {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Reservation, 0, len(s.byMA))
	for _, r := range s.byMA {
		out = append(out, r)
	}
	return out
}

// LeaseSeen reports when the MAC was last acknowledged (zero if never).
func (s *Server) LeaseSeen(mac string) time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.seen[strings.ToLower(mac)]
}

// Reply builds the answer to a request, or nil for a client we must not answer.
func (s *Server) Reply(req *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	if req.OpCode != dhcpv4.OpcodeBootRequest {
		return nil
	}
	s.mu.RLock()
	r, ok := s.byMA[strings.ToLower(req.ClientHWAddr.String())]
	s.mu.RUnlock()
	if !ok {
		return nil // unknown MACs get nothing
	}
	ip := net.ParseIP(r.IP).To4()
	var mt dhcpv4.MessageType
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		mt = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest:
		want := req.RequestedIPAddress()
		if want == nil || want.IsUnspecified() {
			want = req.ClientIPAddr
		}
		if want != nil && !want.IsUnspecified() && !want.Equal(ip) {
			mt = dhcpv4.MessageTypeNak
		} else {
			mt = dhcpv4.MessageTypeAck
		}
	default:
		return nil
	}
	mods := []dhcpv4.Modifier{dhcpv4.WithMessageType(mt), dhcpv4.WithServerIP(s.cfg.ServerIP),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(s.cfg.ServerIP))}
	if mt != dhcpv4.MessageTypeNak {
		mods = append(mods, dhcpv4.WithYourIP(ip), dhcpv4.WithNetmask(s.cfg.Netmask), dhcpv4.WithRouter(s.cfg.ServerIP),
			dhcpv4.WithDNS(s.cfg.DNS...), dhcpv4.WithLeaseTime(uint32(s.cfg.LeaseTime.Seconds())))
		if r.Hostname != "" {
			mods = append(mods, dhcpv4.WithOption(dhcpv4.OptHostName(r.Hostname)))
		}
	}
	resp, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		s.cfg.Logger.Warn("dhcp reply", "err", err)
		return nil
	}
	if mt == dhcpv4.MessageTypeAck {
		s.mu.Lock()
		s.seen[strings.ToLower(req.ClientHWAddr.String())] = time.Now()
		if err := s.persist(); err != nil {
			s.cfg.Logger.Warn("dhcp: lease time not kept", "err", err)
		}
		s.mu.Unlock()
	}
	return resp
}

func (s *Server) handle(conn net.PacketConn, peer net.Addr, req *dhcpv4.DHCPv4) {
	resp := s.Reply(req)
	if resp == nil {
		return
	}
	// Clients without an address yet get the broadcast answer.
	dst := peer
	if ua, ok := peer.(*net.UDPAddr); ok && (ua.IP.IsUnspecified() || ua.IP.Equal(net.IPv4zero)) {
		dst = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
	}
	if _, err := conn.WriteTo(resp.ToBytes(), dst); err != nil {
		s.cfg.Logger.Warn("dhcp send", "err", err)
	}
}

// Listen binds port 67 on the interface.
func (s *Server) Listen() error {
	srv, err := server4.NewServer(s.cfg.Interface, &net.UDPAddr{IP: net.IPv4zero, Port: dhcpv4.ServerPort}, s.handle)
	if err != nil {
		return fmt.Errorf("dhcpd: listen on %s: %w", s.cfg.Interface, err)
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	return nil
}

// Serve answers requests until Close (listening first if Listen was not called).
func (s *Server) Serve() error {
	s.mu.RLock()
	srv := s.srv
	s.mu.RUnlock()
	if srv == nil {
		if err := s.Listen(); err != nil {
			return err
		}
		s.mu.RLock()
		srv = s.srv
		s.mu.RUnlock()
	}
	return srv.Serve()
}

// Close stops serving.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return nil
	}
	return s.srv.Close()
}
