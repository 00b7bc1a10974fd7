package e2e

import (
	"io"
	"net"
	"sync"

	"github.com/rogpeppe/go-internal/testscript"
)

// libvirtSocket is where libvirtd listens (.ci/run starts it).
const libvirtSocket = "/run/libvirt/libvirt-sock"

// relay is a Unix socket in front of libvirtd's, so one script can take "libvirtd" away
// from its hostd (libvirtdown) while libvirtd keeps serving the scripts running beside it.
// To hostd it is libvirtd: the same protocol, byte for byte, until the socket goes dead.
type relay struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

var (
	relaysMu sync.Mutex
	relays   = map[*testscript.TestScript]*relay{}
)

// libvirtRelay starts the relay in $WORK and sets VAR to its path.
// Usage: libvirtrelay VAR
func libvirtRelay(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: libvirtrelay VAR")
	}
	path := ts.MkAbs("libvirt-relay.sock")
	ln, err := net.Listen("unix", path)
	ts.Check(err)
	r := &relay{ln: ln}
	relaysMu.Lock()
	relays[ts] = r
	relaysMu.Unlock()
	ts.Defer(func() {
		r.stop()
		relaysMu.Lock()
		delete(relays, ts)
		relaysMu.Unlock()
	})
	go r.serve()
	ts.Setenv(args[0], path)
}

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("unix", libvirtSocket)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		if r.down {
			r.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

// stop closes the listener and every relayed connection: libvirtd is gone for this script.
func (r *relay) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = true
	_ = r.ln.Close()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// libvirtDown takes this script's libvirtd away (see libvirtrelay). Usage: libvirtdown
func libvirtDown(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: libvirtdown")
	}
	relaysMu.Lock()
	r := relays[ts]
	relaysMu.Unlock()
	if r == nil {
		ts.Fatalf("libvirtdown: no libvirtrelay in this script")
	}
	r.stop()
}
