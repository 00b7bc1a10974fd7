package controller

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, store.MigrateForTest)) }

// listeningAddrs returns the TCP addresses this process listens on, from /proc (so a
// listener nobody knows about is found too).
func listeningAddrs(t *testing.T) map[string]bool {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	out := map[string]bool{}
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fl := strings.Fields(line)
			if len(fl) < 10 || fl[3] != "0A" || !inodes[fl[9]] { // 0A: LISTEN
				continue
			}
			hostHex, portHex, _ := strings.Cut(fl[1], ":")
			port, _ := strconv.ParseUint(portHex, 16, 16)
			raw, _ := hex.DecodeString(hostHex)
			ip := make(net.IP, len(raw))
			for i := 0; i < len(raw); i += 4 { // /proc prints each 32-bit word little-endian
				ip[i], ip[i+1], ip[i+2], ip[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
			}
			if ip.IsUnspecified() {
				ip = net.IPv4(127, 0, 0, 1)
				if len(raw) == 16 {
					ip = net.IPv6loopback
				}
			}
			out[net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))] = true
		}
	}
	return out
}

// Every TCP listener the controller opens — the API (which also serves /metrics and the
// terminal relay) and pprof — speaks TLS with the controller's certificate and answers
// nothing useful in plaintext; the state directory's secrets are 0600 in 0700 directories.
func TestControllerHasNoPlaintextListener(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	cfg := Config{StateDir: dir, Listen: "127.0.0.1:0", DatabaseURL: pgtest.NewDatabase(t), PprofListen: "127.0.0.1:0",
		MaxDBConns: 4, HeartbeatMaxAge: 2 * time.Minute, TaskLease: 2 * time.Minute, ProvisionTTL: 20 * time.Minute,
		TerminalIdle: 30 * time.Minute, TerminalMaxPerTenant: 8}
	before := listeningAddrs(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, cfg, "test", slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("Serve did not stop")
		}
	}()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "controller.addr")); err == nil {
			break
		}
		select {
		case err := <-errc:
			t.Fatalf("Serve ended: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("controller not listening after 90s")
		}
		time.Sleep(50 * time.Millisecond) // poll interval, bounded by the deadline
	}
	var opened []string
	for a := range listeningAddrs(t) {
		if !before[a] {
			opened = append(opened, a)
		}
	}
	if len(opened) < 2 {
		t.Fatalf("found %d new listeners (%v), want the API and pprof", len(opened), opened)
	}
	caPEM, err := os.ReadFile(pki.Paths{Dir: dir}.CACert())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tlsCfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer hc.CloseIdleConnections()
	served := map[string]bool{}
	for _, addr := range opened {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, tlsCfg)
		if err != nil {
			t.Errorf("%s: no TLS with the controller's certificate: %v", addr, err)
			continue
		}
		conn.Close()
		plain, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = plain.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(plain, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		line, _ := bufio.NewReader(plain).ReadString('\n')
		plain.Close()
		if strings.Contains(line, " 200 ") || strings.Contains(line, " 30") {
			t.Errorf("%s answers plaintext HTTP: %q", addr, line)
		}
		for _, p := range []string{"/healthz", "/metrics", "/debug/pprof/cmdline"} {
			if resp, err := hc.Get("https://" + addr + p); err == nil {
				if resp.StatusCode == 200 {
					served[p] = true
				}
				resp.Body.Close()
			}
		}
	}
	for _, p := range []string{"/healthz", "/metrics", "/debug/pprof/cmdline"} {
		if !served[p] {
			t.Errorf("no listener served %s over TLS", p)
		}
	}

	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." || rel == "controller.addr" {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %04o, want %04o", rel, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
