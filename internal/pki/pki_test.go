package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestInitCreatesFilesWithModesAndIsIdempotent(t *testing.T) {
	dir := t.TempDir()
	res, err := Init(InitOptions{Dir: dir, Hostnames: []string{"ctl.example"}})
	if err != nil {
		t.Fatal(err)
	}
	p := Paths{Dir: dir}
	want := map[string]os.FileMode{p.CACert(): 0o644, p.CAKey(): 0o600, p.ServerCert(): 0o644, p.ServerKey(): 0o600,
		p.SigningKey(): 0o600, p.SigningPub(): 0o644, p.AdminToken(): 0o600}
	for f, m := range want {
		if got := mode(t, f); got != m {
			t.Fatalf("%s mode %04o, want %04o", f, got, m)
		}
	}
	if len(res.Created) != len(want) || !strings.HasPrefix(res.AdminToken, "gpa_") {
		t.Fatalf("result = %+v", res)
	}
	b, _ := os.ReadFile(p.AdminToken())
	if strings.TrimSpace(string(b)) != res.AdminToken {
		t.Fatal("admin.token differs from the returned token")
	}
	again, err := Init(InitOptions{Dir: dir, Hostnames: []string{"ctl.example"}})
	if err != nil || len(again.Created) != 0 || again.AdminToken != "" {
		t.Fatalf("second Init = %+v, %v", again, err)
	}
	// A new hostname re-issues only the server certificate.
	more, err := Init(InitOptions{Dir: dir, Hostnames: []string{"ctl.example", "10.0.0.5"}})
	if err != nil || len(more.Created) != 2 {
		t.Fatalf("new SAN Init = %+v, %v", more, err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "tls"))
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Fatalf("temp file left: %s", e.Name())
		}
	}
}

func TestInsecureKeyModeRefused(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(Paths{Dir: dir}.CAKey(), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Init(InitOptions{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "must be 0600") {
		t.Fatalf("Init with 0644 ca.key: %v", err)
	}
}

// serve runs one TLS handshake with the server config and returns the peer CN seen.
func handshake(t *testing.T, srvCfg, cliCfg *tls.Config, serverName string) (string, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cn := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			cn <- ""
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			cn <- ""
			return
		}
		name := ""
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			name = certs[0].Subject.CommonName
		}
		_, _ = io.WriteString(tc, "ok")
		cn <- name
	}()
	cfg := cliCfg.Clone()
	cfg.ServerName = serverName
	conn, err := tls.Dial("tcp", ln.Addr().String(), cfg)
	if err != nil {
		<-cn
		return "", err
	}
	defer conn.Close()
	buf := make([]byte, 2)
	_, _ = io.ReadFull(conn, buf)
	return <-cn, nil
}

func TestTLSHandshakeAndClientCerts(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(InitOptions{Dir: dir, Hostnames: []string{"ctl.example"}}); err != nil {
		t.Fatal(err)
	}
	srv, err := ServerTLSConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ClientTLSConfig(Paths{Dir: dir}.CACert())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"localhost", "127.0.0.1", "ctl.example"} {
		if _, err := handshake(t, srv, cli, name); err != nil {
			t.Fatalf("handshake as %s: %v", name, err)
		}
	}
	if _, err := handshake(t, srv, cli, "other.example"); err == nil {
		t.Fatal("handshake for a name not in the certificate succeeded")
	}
	other := t.TempDir()
	if _, err := Init(InitOptions{Dir: other}); err != nil {
		t.Fatal(err)
	}
	otherCli, _ := ClientTLSConfig(Paths{Dir: other}.CACert())
	if _, err := handshake(t, srv, otherCli, "localhost"); err == nil {
		t.Fatal("client trusting another CA accepted the server")
	}
	// A host's client certificate issued by the CA is seen by the server.
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	certPEM, err := ca.IssueClientCert(&key.PublicKey, "node:h200-01", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalECPrivateKey(key)
	pair, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	withCert := cli.Clone()
	withCert.Certificates = []tls.Certificate{pair}
	cn, err := handshake(t, srv, withCert, "localhost")
	if err != nil || cn != "node:h200-01" {
		t.Fatalf("mTLS handshake: cn=%q err=%v", cn, err)
	}
}

func TestSigningKeyRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	priv, err := LoadSigningKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := LoadSigningPub(Paths{Dir: dir}.SigningPub())
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(priv.Public()) {
		t.Fatal("public key does not match private key")
	}
}

func TestTokens(t *testing.T) {
	a, _ := NewToken("gpa")
	b, _ := NewToken("gpa")
	if a == b || !strings.HasPrefix(a, "gpa_") || len(a) < 40 {
		t.Fatalf("tokens %q %q", a, b)
	}
	if h := HashToken(a); h != HashToken(strings.Clone(a)) || h == HashToken(b) || len(HashToken(a)) != 64 {
		t.Fatal("hash not deterministic or not distinct")
	}
	if _, err := ClientTLSConfig(filepath.Join(t.TempDir(), "missing.crt")); err == nil {
		t.Fatal("missing CA file accepted")
	}
}
