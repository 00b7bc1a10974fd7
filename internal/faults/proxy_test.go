package faults

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy is a TCP proxy between hosts and a controller that the test can partition: Cut
// blackholes the path (bytes in either direction vanish, connections stay open, new ones are
// accepted and never answered: what a dead link or a dropping firewall looks like to both
// ends), Heal restores it (connections that lived through the cut are closed, as their
// peers would find them broken once packets flow again).
type proxy struct {
	t      *testing.T
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool // open connections (both sides); true = lived through a cut
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(p.close)
	go p.accept()
	return p
}

// URL is the https:// address hosts are given.
func (p *proxy) URL() string { return "https://" + p.ln.Addr().String() }

// Cut partitions: nothing crosses until Heal.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		p.conns[c] = true
	}
}

// Heal ends the partition.
func (p *proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	for c, cut := range p.conns {
		if cut {
			c.Close()
			delete(p.conns, c)
		}
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *proxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = p.cut
}

func (p *proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(in)
		go p.serve(in)
	}
}

func (p *proxy) serve(in net.Conn) {
	if p.isCut() {
		// Blackholed from the start: read and drop until Heal closes it.
		_, _ = io.Copy(io.Discard, in)
		return
	}
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		in.Close()
		return
	}
	p.track(out)
	go p.pipe(out, in)
	p.pipe(in, out)
}

// pipe copies src to dst, dropping what arrives while the path is cut.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.isCut() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
