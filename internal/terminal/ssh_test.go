package terminal

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// guest is an in-process SSH server standing in for a slice VM's sshd (fast tests; the lab
// test uses the real guest's dropbear). It runs three "commands": cat (stdin to stdout until
// EOF), fail (stderr, exit 3), and a shell that reports its PTY size.
type guest struct {
	addr string
	mu   sync.Mutex
	pty  [2]uint32 // cols, rows as last set
}

func startGuest(t *testing.T, clientKey ssh.PublicKey) *guest {
	t.Helper()
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	hostSigner, _ := ssh.NewSignerFromKey(hostPriv)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if string(k.Marshal()) == string(clientKey.Marshal()) {
			return nil, nil
		}
		return nil, io.EOF
	}}
	cfg.AddHostKey(hostSigner)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g := &guest{addr: l.Addr().String()}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go g.serve(c, cfg)
		}
	}()
	return g
}

func (g *guest) serve(c net.Conn, cfg *ssh.ServerConfig) {
	_, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go func() {
			defer ch.Close()
			exit := func(code uint32) {
				var b [4]byte
				binary.BigEndian.PutUint32(b[:], code)
				_, _ = ch.SendRequest("exit-status", false, b[:])
			}
			for r := range creqs {
				switch r.Type {
				case "pty-req", "window-change":
					p := r.Payload
					if r.Type == "pty-req" {
						n := binary.BigEndian.Uint32(p)
						p = p[4+n:]
					}
					g.mu.Lock()
					g.pty = [2]uint32{binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])}
					g.mu.Unlock()
					_ = r.Reply(true, nil)
				case "exec":
					_ = r.Reply(true, nil)
					cmd := string(r.Payload[4:])
					switch cmd {
					case "cat":
						_, _ = io.Copy(ch, ch)
						exit(0)
					case "fail":
						_, _ = ch.Stderr().Write([]byte("it broke\n"))
						exit(3)
					}
					return
				case "shell":
					_ = r.Reply(true, nil)
					g.mu.Lock()
					_, _ = io.WriteString(ch, "pty "+itoa(g.pty[0])+"x"+itoa(g.pty[1])+"\n")
					g.mu.Unlock()
				default:
					_ = r.Reply(false, nil)
				}
			}
		}()
	}
}

func itoa(n uint32) string {
	s := ""
	for {
		s = string(rune('0'+n%10)) + s
		n /= 10
		if n == 0 {
			return s
		}
	}
}

func guestSession(t *testing.T) (*ssh.Session, *guest) {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := ssh.NewSignerFromKey(priv)
	g := startGuest(t, signer.PublicKey())
	cl, err := ssh.Dial("tcp", g.addr, &ssh.ClientConfig{User: "debian", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey()}) // the pinning lives in slicevm; this tests the stream
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	s, err := cl.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	return s, g
}

// drive runs ServeSSH on one end of a pipe and returns the other (the relay's side).
func drive(t *testing.T, s *ssh.Session, cols, rows int, cmd string) (net.Conn, chan int) {
	a, b := net.Pipe()
	done := make(chan int, 1)
	go func() {
		st, _ := ServeSSH(a, s, cols, rows, cmd)
		done <- st
	}()
	return b, done
}

// collect reads frames until the exit frame.
func collect(t *testing.T, c net.Conn) (stdout, stderr string, status int) {
	t.Helper()
	for {
		typ, p, err := ReadFrame(c)
		if err != nil {
			t.Fatalf("stream ended before the exit frame: %v", err)
		}
		switch typ {
		case FrameData:
			stdout += string(p)
		case FrameStderr:
			stderr += string(p)
		case FrameExit:
			status, _, _ = ParseExit(p)
			return
		}
	}
}

func TestServeSSHCommandStdinAndExitStatus(t *testing.T) {
	s, _ := guestSession(t)
	c, done := drive(t, s, 0, 0, "cat")
	go func() {
		_ = WriteFrame(c, FrameData, []byte("piped stdin\n"))
		_ = WriteFrame(c, FrameEOF, nil)
	}()
	out, _, st := collect(t, c)
	if out != "piped stdin\n" || st != 0 || <-done != 0 {
		t.Fatalf("out %q status %d", out, st)
	}

	s2, _ := guestSession(t)
	c2, _ := drive(t, s2, 0, 0, "fail")
	out, errOut, st := collect(t, c2)
	if out != "" || errOut != "it broke\n" || st != 3 {
		t.Fatalf("out %q err %q status %d", out, errOut, st)
	}
}

func TestServeSSHPTYAndResize(t *testing.T) {
	s, g := guestSession(t)
	c, _ := drive(t, s, 132, 43, "")
	typ, p, err := ReadFrame(c)
	if err != nil || typ != FrameData || !strings.Contains(string(p), "pty 132x43") {
		t.Fatalf("shell said %q (%v)", p, err)
	}
	if err := WriteFrame(c, FrameResize, Resize(90, 30)); err != nil {
		t.Fatal(err)
	}
	for {
		g.mu.Lock()
		got := g.pty
		g.mu.Unlock()
		if got == [2]uint32{90, 30} {
			break
		}
		runtime.Gosched() // until the resize arrived; bounded by the test timeout
	}
	c.Close() // the client goes away: the remote session is closed too
}
