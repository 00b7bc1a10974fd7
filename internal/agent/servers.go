package agent

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
)

// ServerList is the controllers hostd may talk to, in preference order: `server` first, then
// `servers` (each entry may itself be comma-separated), duplicates dropped. One address (a
// load balancer) is the common case; several let hostd fail over without one.
func (c Config) ServerList() []string {
	var out []string
	for _, s := range append([]string{c.Server}, c.Servers...) {
		for _, p := range strings.Split(s, ",") {
			p = strings.TrimRight(strings.TrimSpace(p), "/")
			if p != "" && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// validServer checks one controller address: https://host[:port] only (hostd authenticates
// with its certificate; plain HTTP would hand a network attacker its tasks).
func validServer(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("server %q must be https://host:port", s)
	}
	return nil
}

// servers rotates through the configured controllers: every request goes to the current
// one; a request that cannot reach it moves hostd to the next (the poll loop's jittered
// exponential backoff spaces the attempts), so a dead replica is left after one failure.
type servers struct {
	list []string
	cur  atomic.Uint32
}

func newServers(list []string) *servers { return &servers{list: list} }

// current is the base URL requests go to now, and its index for failover.
func (s *servers) current() (string, uint32) {
	i := s.cur.Load()
	return s.list[int(i)%len(s.list)], i
}

// failover moves on from the server at index i, unless a concurrent request already did.
// It reports whether another server is configured.
func (s *servers) failover(i uint32) bool {
	if len(s.list) < 2 {
		return false
	}
	s.cur.CompareAndSwap(i, (i+1)%uint32(len(s.list)))
	return true
}

func (s *servers) String() string { return strings.Join(s.list, ",") }
