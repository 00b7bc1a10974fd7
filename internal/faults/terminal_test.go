package faults

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// Cross-replica terminal sessions: a session is spliced by the replica that opened it; either
// end may attach to any replica, which authenticates it and relays it to the owner. Two real
// controller processes on one PostgreSQL, a real hostd (the sim runtime's echo guest: the one
// simulated part) and real TLS throughout.
func TestTerminalAcrossReplicas(t *testing.T) {
	c := newCluster(t, 2, "--terminal-record-dir", filepath.Join(workRoot, t.Name()+"-recordings"))
	h := c.addHost([]string{c.A.Server})
	viaA, viaB := c.tenant(c.A.Server), c.tenant(c.B.Server)
	a, err := viaA.CreateAllocation(c.ctx, oneGPU(), "")
	if err != nil {
		t.Fatal(err)
	}
	allocStatus(t, viaA, a.ID, 90*time.Second, "active")
	var recorded string // a session with a recording A wrote

	t.Run("opened on A, host on A, client through B", func(t *testing.T) {
		tk := open(t, viaA, a.ID, "exit 7")
		s := converse(t, attach(t, viaB, tk), "hello from B", "second line")
		c.ended(t, tk.SessionID, s, 7, viaA, viaB)
		// The recording, written by the owner A, holds what the guest echoed; B serves it by
		// asking A (A's request counter proves it: both replicas share this machine's disk).
		cast, err := viaB.Recording(c.ctx, tk.SessionID)
		if err != nil || !strings.Contains(string(cast), "hello from B") || !strings.Contains(string(cast), "second line") {
			t.Fatalf("recording: %v\n%s", err, cast)
		}
		// (A counts a request after answering it: wait for the count, then check it is one.)
		served := `gpuaas_api_requests_total{code="200",route="GET /api/v1/replica/recordings/{session}"}`
		waitFor(t, "A to count the recording it served", 30*time.Second, func() (bool, error) { return metric(t, c.A, served) >= 1, nil })
		if n := metric(t, c.A, served); n != 1 {
			t.Fatalf("A served %v recordings to B, want 1", n)
		}
		recorded = tk.SessionID
	})

	// hostd now dials B (its only server): the session opened on A reaches A through B.
	h.stop()
	h.args = append(h.args, "--server", c.B.Server)
	h.start()

	t.Run("opened on A, host through B, client on A", func(t *testing.T) {
		tk := open(t, viaA, a.ID, "exit 3")
		conn := attach(t, viaA, tk)
		s := converse(t, conn, "reverse")
		c.ended(t, tk.SessionID, s, 3, viaA, viaB)
	})

	t.Run("another tenant gets nowhere through either replica", func(t *testing.T) {
		other := c.otherTenant()
		tk := open(t, viaA, a.ID, "exit 0")
		for _, srv := range []string{c.A.Server, c.B.Server} {
			cl := c.clientFor(srv, other)
			if _, err := cl.OpenTerminal(c.ctx, a.ID, apiv1.TerminalRequest{Mode: "terminal"}); apiCode(err) != apiv1.CodeNotFound {
				t.Fatalf("%s: the other tenant opened a session into A's allocation: %v", srv, err)
			}
			if _, err := cl.Attach(c.ctx, tk); apiCode(err) != apiv1.CodeUnauthorized {
				t.Fatalf("%s: the other tenant attached with A's ticket: %v", srv, err)
			}
		}
		// The refusals spent nothing: the ticket's owner still attaches (through B).
		c.ended(t, tk.SessionID, converse(t, attach(t, viaB, tk), "still mine"), 0, viaA, viaB)
	})

	t.Run("a relay request without the controller credential is refused", func(t *testing.T) {
		tk := open(t, viaA, a.ID, "exit 0")
		path := "/api/v1/replica/terminal/" + tk.SessionID + "/client"
		caTLS, err := pki.ClientTLSConfig(c.A.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		nodeCert, err := tls.LoadX509KeyPair(filepath.Join(h.dir, "hostd.crt"), filepath.Join(h.dir, "hostd.key"))
		if err != nil {
			t.Fatal(err)
		}
		withNode := caTLS.Clone()
		withNode.Certificates = []tls.Certificate{nodeCert}
		tenantBearer := http.Header{"Authorization": {"Bearer " + c.A.Token}}
		for _, f := range []struct {
			name   string
			tls    *tls.Config
			header http.Header
			want   int
		}{
			{"the tenant's bearer token, no certificate", caTLS, tenantBearer, http.StatusUnauthorized},
			{"a host's node certificate", withNode, nil, http.StatusForbidden},
		} {
			for _, srv := range []string{c.A.Server, c.B.Server} {
				conn, err := terminal.Dial(c.ctx, f.tls, srv, path, f.header)
				var refused *terminal.RefusedError
				if !errors.As(err, &refused) || refused.Code != f.want {
					if conn != nil {
						conn.Close()
					}
					t.Fatalf("%s to %s: %v, want a %d refusal", f.name, srv, err, f.want)
				}
			}
		}
		// A certificate for "controller:..." from another CA fails the TLS handshake.
		forged := forgedControllerTLS(t, caTLS)
		if conn, err := terminal.Dial(c.ctx, forged, c.A.Server, path, nil); err == nil {
			conn.Close()
			t.Fatal("a controller certificate of a foreign CA was accepted")
		}
		// None of it touched the session: the tenant attaches and runs it.
		conn := attach(t, viaA, tk)
		c.ended(t, tk.SessionID, converse(t, conn, "untouched"), 0, viaA, viaB)
	})

	t.Run("a release through B ends the session A holds", func(t *testing.T) {
		a2, err := viaA.CreateAllocation(c.ctx, oneGPU(), "")
		if err != nil {
			t.Fatal(err)
		}
		allocStatus(t, viaA, a2.ID, 90*time.Second, "active")
		tk := open(t, viaA, a2.ID, "exit 0")
		conn := attach(t, viaA, tk)
		defer conn.Close()
		echo(t, conn, "x")
		if _, err := viaB.ReleaseAllocation(c.ctx, a2.ID); err != nil {
			t.Fatal(err)
		}
		status, msg := readExit(t, conn)
		if status != 255 || msg != "allocation released" {
			t.Fatalf("exit %d %q, want 255 allocation released", status, msg)
		}
		waitFor(t, "the session to be recorded as ended", 30*time.Second, func() (bool, error) {
			s, err := viaB.GetSession(c.ctx, tk.SessionID)
			return err == nil && s.Status == "ended" && s.EndReason == "allocation released", err
		})
	})

	t.Run("the owner shuts down: it ends and records its sessions, the client through B is told", func(t *testing.T) {
		tk := open(t, viaA, a.ID, "exit 0")
		conn := attach(t, viaB, tk)
		defer conn.Close()
		n := echo(t, conn, "before the shutdown")
		c.A.StopController() // SIGTERM
		status, msg := readExit(t, conn)
		if status != 255 || msg != "controller replica shutting down" {
			t.Fatalf("exit %d %q, want 255 controller replica shutting down", status, msg)
		}
		// The client hears before the owner writes the record (it does before it exits).
		var s *apiv1.TerminalSession
		waitFor(t, "the owner's record of its last session", 30*time.Second, func() (bool, error) {
			s, err = viaB.GetSession(c.ctx, tk.SessionID)
			return err == nil && s.Status == "ended", err
		})
		if s.EndReason != "controller replica shutting down" || s.BytesIn != int64(5+len("before the shutdown")) || s.BytesOut != n {
			t.Fatalf("the owner's record of its last session: %+v (want %d bytes out)", s, n)
		}
		if n, err := c.A.Int(c.ctx, `SELECT count(*) FROM audit_log WHERE action IN ('terminal.end', 'terminal.owner_lost') AND details->>'session_id' = $1`, tk.SessionID); err != nil || n != 1 {
			t.Fatalf("%d end audits (%v), want 1", n, err)
		}
		c.restartA()
	})

	t.Run("the owner is killed: the client through B is told, the session is ended", func(t *testing.T) {
		tk := open(t, viaA, a.ID, "exit 0")
		conn := attach(t, viaB, tk)
		defer conn.Close()
		echo(t, conn, "before")
		if err := c.A.KillController(); err != nil {
			t.Fatal(err)
		}
		status, msg := readExit(t, conn)
		if status != 255 || !strings.Contains(msg, c.A.Server) || !strings.Contains(msg, "went away") {
			t.Fatalf("exit %d %q, want 255 naming the lost replica %s", status, msg, c.A.Server)
		}
		waitFor(t, "the session to be recorded as ended", 30*time.Second, func() (bool, error) {
			s, err := viaB.GetSession(c.ctx, tk.SessionID)
			return err == nil && s.Status == "ended" && strings.Contains(s.EndReason, "owning controller replica lost"), err
		})
		if n, err := c.A.Int(c.ctx, `SELECT count(*) FROM audit_log WHERE action = 'terminal.owner_lost' AND details->>'session_id' = $1`, tk.SessionID); err != nil || n != 1 {
			t.Fatalf("%d terminal.owner_lost audits (%v), want 1", n, err)
		}
		// With A gone, B serves A's recording from the disk they share (the fallback for
		// recordings on shared storage).
		if cast, err := viaB.Recording(c.ctx, recorded); err != nil || !strings.Contains(string(cast), "hello from B") {
			t.Fatalf("recording of A's session with A down: %v", err)
		}
		// Sessions A opened that nobody attached yet (the host is stopped, so it cannot take
		// them first): attaching through B says the owner is unreachable (503, not retryable)
		// and ends the session; the one nobody tried is ended when A starts again.
		h.stop()
		c.restartA()
		viaNewA := c.tenant(c.A.Server)
		tk2, tk3 := open(t, viaNewA, a.ID, "exit 0"), open(t, viaNewA, a.ID, "exit 0")
		if err := c.A.KillController(); err != nil {
			t.Fatal(err)
		}
		_, err = viaB.Attach(c.ctx, tk2)
		var ae *apiv1.Error
		if !errors.As(err, &ae) || ae.Code != apiv1.CodeUnavailable || !strings.Contains(ae.Message, "unreachable") {
			t.Fatalf("attach to a session of a dead replica: %v", err)
		}
		s, err := viaB.GetSession(c.ctx, tk2.SessionID)
		if err != nil || s.Status != "ended" || !strings.Contains(s.EndReason, "unreachable") {
			t.Fatalf("session of the dead replica: %+v %v", s, err)
		}
		if s, err := viaB.GetSession(c.ctx, tk3.SessionID); err != nil || s.Status == "ended" {
			t.Fatalf("untried session of the dead replica before it restarts: %+v %v", s, err)
		}
		c.restartA()
		s, err = viaB.GetSession(c.ctx, tk3.SessionID)
		if err != nil || s.Status != "ended" || s.EndReason != "controller replica restarted" {
			t.Fatalf("the restarted owner's old session: %+v %v", s, err)
		}
		for _, id := range []string{tk2.SessionID, tk3.SessionID} {
			n, err := c.A.Int(c.ctx, `SELECT count(*) FROM audit_log WHERE action IN ('terminal.end', 'terminal.owner_lost') AND details->>'session_id' = $1`, id)
			if err != nil || n != 1 {
				t.Fatalf("session %s: %d end audits (%v), want 1", id, n, err)
			}
		}
	})
}

// open asks for a terminal-mode session running command (the sim guest exits with "exit N").
func open(t *testing.T, cl *client.Client, alloc, command string) *apiv1.TerminalTicket {
	t.Helper()
	tk, err := cl.OpenTerminal(context.Background(), alloc, apiv1.TerminalRequest{Mode: "terminal", Command: command})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// attach attaches to a ticket's session through cl's replica.
func attach(t *testing.T, cl *client.Client, tk *apiv1.TerminalTicket) net.Conn {
	t.Helper()
	conn, err := cl.Attach(context.Background(), tk)
	if err != nil {
		t.Fatalf("attach through %s: %v", cl.Server(), err)
	}
	return conn
}

// exchange is what the client sent and received on a session, in bytes and in meaning.
type exchange struct {
	sent, received int64
	status         int
}

// converse sends lines (each must come back: the sim guest echoes), closes stdin and reads
// the exit frame; it counts the bytes each way as the relay's hub must.
func converse(t *testing.T, conn net.Conn, lines ...string) exchange {
	t.Helper()
	defer conn.Close()
	var x exchange
	for _, l := range lines {
		x.sent += int64(5 + len(l))
		x.received += echo(t, conn, l)
	}
	if err := terminal.WriteFrame(conn, terminal.FrameEOF, nil); err != nil {
		t.Fatal(err)
	}
	x.sent += 5
	x.received += readUntil(t, conn, func(typ byte, p []byte) bool {
		if typ == terminal.FrameExit {
			x.status, _, _ = terminal.ParseExit(p)
		}
		return typ == terminal.FrameExit
	})
	return x
}

// echo sends line as stdin and reads until the guest echoed it; it returns the bytes read.
func echo(t *testing.T, conn net.Conn, line string) int64 {
	t.Helper()
	if err := terminal.WriteFrame(conn, terminal.FrameData, []byte(line)); err != nil {
		t.Fatal(err)
	}
	return readUntil(t, conn, func(typ byte, p []byte) bool {
		if typ == terminal.FrameExit {
			t.Fatalf("exit before the echo of %q: %q", line, p)
		}
		return typ == terminal.FrameData && string(p) == line
	})
}

// readUntil reads frames until done says so (within a generous deadline) and returns the
// bytes read.
func readUntil(t *testing.T, conn net.Conn, done func(byte, []byte) bool) int64 {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	var n int64
	for {
		typ, p, err := terminal.ReadFrame(conn)
		if err != nil {
			t.Fatalf("reading the session: %v", err)
		}
		n += int64(5 + len(p))
		if done(typ, p) {
			return n
		}
	}
}

// readExit reads frames until the exit frame and returns its status and message.
func readExit(t *testing.T, conn net.Conn) (status int, msg string) {
	t.Helper()
	readUntil(t, conn, func(typ byte, p []byte) bool {
		if typ == terminal.FrameExit {
			status, msg, _ = terminal.ParseExit(p)
		}
		return typ == terminal.FrameExit
	})
	return status, msg
}

// ended waits until the session is recorded as ended and checks the record, the same through
// every replica: exit status, bytes each way exactly as the client counted them, recorded
// once (one terminal.end audit).
func (c *cluster) ended(t *testing.T, id string, x exchange, status int, via ...*client.Client) {
	t.Helper()
	if x.status != status {
		t.Fatalf("the client read exit status %d, want %d", x.status, status)
	}
	var first *apiv1.TerminalSession
	waitFor(t, "session "+id+" to end", 30*time.Second, func() (bool, error) {
		s, err := via[0].GetSession(c.ctx, id)
		first = s
		return err == nil && s.Status == "ended", err
	})
	if first.ExitStatus == nil || *first.ExitStatus != status || first.EndReason != "exited" || first.BytesIn != x.sent || first.BytesOut != x.received {
		t.Fatalf("session record %+v (exit %v), want exited with %d, %d bytes in, %d out", first, first.ExitStatus, status, x.sent, x.received)
	}
	for _, cl := range via[1:] {
		s, err := cl.GetSession(c.ctx, id)
		if err != nil || s.Status != first.Status || s.BytesIn != first.BytesIn || s.BytesOut != first.BytesOut || *s.ExitStatus != *first.ExitStatus {
			t.Fatalf("replicas disagree on session %s: %+v / %+v (%v)", id, first, s, err)
		}
	}
	if n, err := c.A.Int(c.ctx, `SELECT count(*) FROM audit_log WHERE action = 'terminal.end' AND details->>'session_id' = $1`, id); err != nil || n != 1 {
		t.Fatalf("%d terminal.end audits for session %s (%v), want exactly 1", n, id, err)
	}
}

// metric reads one sample of the controller's /metrics (0 when absent).
func metric(t *testing.T, e *benchenv.Env, sample string) float64 {
	t.Helper()
	cfg, err := pki.ClientTLSConfig(e.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(e.Server + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			var f float64
			_, _ = fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

// otherTenant creates a second tenant and returns its token.
func (c *cluster) otherTenant() string {
	c.t.Helper()
	ten, err := c.admin.CreateTenant(c.ctx, "other")
	if err != nil {
		c.t.Fatal(err)
	}
	tok, err := c.admin.CreateToken(c.ctx, apiv1.TokenCreate{Name: "other-tenant", Role: "tenant", TenantID: ten.ID})
	if err != nil {
		c.t.Fatal(err)
	}
	return tok.Token
}

func (c *cluster) clientFor(server, token string) *client.Client {
	c.t.Helper()
	cl, err := client.New(client.Options{Server: server, CAFile: c.A.CAFile, Token: token})
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

func apiCode(err error) string {
	var ae *apiv1.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return fmt.Sprint(err)
}

// forgedControllerTLS presents a "controller:" client certificate from a CA of its own.
func forgedControllerTLS(t *testing.T, base *tls.Config) *tls.Config {
	t.Helper()
	dir := t.TempDir()
	if _, err := pki.Init(pki.InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	own, err := ca.ReplicaTLSConfig("forger")
	if err != nil {
		t.Fatal(err)
	}
	cfg := base.Clone()
	cfg.GetClientCertificate = own.GetClientCertificate
	return cfg
}
