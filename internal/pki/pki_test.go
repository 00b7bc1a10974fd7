package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
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

func read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustInit(t *testing.T, opts InitOptions) InitResult {
	t.Helper()
	res, err := Init(opts)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func serverCert(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	c, err := parseCert(read(t, Paths{Dir: dir}.ServerCert()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func caPool(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(read(t, Paths{Dir: dir}.CACert())) {
		t.Fatal("no CA cert")
	}
	return pool
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func noTempFiles(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if strings.Contains(e.Name(), ".tmp-") {
				t.Fatalf("temp file left: %s", filepath.Join(d, e.Name()))
			}
		}
	}
}

func TestInitCreatesFilesWithModesAndIsIdempotent(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "state")
	res := mustInit(t, InitOptions{Dir: dir, Hostnames: []string{"ctl.example"}})
	p := Paths{Dir: dir}
	// Every file is 0600, the public halves too: nothing in the state directory is meant for
	// other local users (hosts and gpuaasctl get the CA through enrollment or the operator).
	want := map[string]os.FileMode{p.CACert(): 0o600, p.CAKey(): 0o600, p.ServerCert(): 0o600, p.ServerKey(): 0o600,
		p.SigningKey(): 0o600, p.SigningPub(): 0o600, p.AdminToken(): 0o600,
		dir: 0o700, filepath.Join(dir, "tls"): 0o700, filepath.Join(dir, "keys"): 0o700}
	for f, m := range want {
		if got := mode(t, f); got != m {
			t.Fatalf("%s mode %04o, want %04o", f, got, m)
		}
	}
	if !sameSet(res.Created, []string{p.CACert(), p.CAKey(), p.ServerCert(), p.ServerKey(), p.SigningKey(), p.SigningPub(), p.AdminToken()}) {
		t.Fatalf("created = %v", res.Created)
	}
	if !strings.HasPrefix(res.AdminToken, "gpa_") {
		t.Fatalf("admin token %q", res.AdminToken)
	}
	if string(read(t, p.AdminToken())) != res.AdminToken+"\n" {
		t.Fatal("admin.token is not the returned token plus a newline")
	}
	for _, f := range []string{p.CAKey(), p.ServerKey(), p.SigningKey()} {
		blk, _ := pem.Decode(read(t, f))
		if blk == nil || blk.Type != "PRIVATE KEY" {
			t.Fatalf("%s is not a PKCS#8 PEM key", f)
		}
	}
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ca.Key.(*ecdsa.PrivateKey); !ok || !ca.Cert.IsCA || ca.Cert.MaxPathLen != 0 || !ca.Cert.MaxPathLenZero ||
		ca.Cert.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign || ca.Cert.SerialNumber.BitLen() < 64 ||
		ca.Cert.NotAfter.Sub(ca.Cert.NotBefore) < 10*365*24*time.Hour {
		t.Fatalf("CA cert: %+v", ca.Cert)
	}
	// The server certificate verifies against the CA for every default and extra name.
	sc := serverCert(t, dir)
	for _, name := range []string{"localhost", "127.0.0.1", "::1", "ctl.example"} {
		if _, err := sc.Verify(x509.VerifyOptions{DNSName: name, Roots: caPool(t, dir), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Fatalf("server cert for %s: %v", name, err)
		}
	}
	if d := sc.NotAfter.Sub(sc.NotBefore); d < 365*24*time.Hour || d > 367*24*time.Hour {
		t.Fatalf("server cert validity %v", d)
	}

	before := map[string][]byte{}
	for f := range want {
		if fi, _ := os.Stat(f); !fi.IsDir() {
			before[f] = read(t, f)
		}
	}
	again := mustInit(t, InitOptions{Dir: dir, Hostnames: []string{"ctl.example"}})
	if len(again.Created) != 0 || again.AdminToken != "" {
		t.Fatalf("second Init = %+v", again)
	}
	// A new hostname re-issues only the server certificate; everything else is untouched.
	more := mustInit(t, InitOptions{Dir: dir, Hostnames: []string{"ctl.example", "10.0.0.5"}})
	if !sameSet(more.Created, []string{p.ServerCert(), p.ServerKey()}) || more.AdminToken != "" {
		t.Fatalf("new SAN Init = %+v", more)
	}
	for f, b := range before {
		if changed := !bytes.Equal(read(t, f), b); changed != (f == p.ServerCert() || f == p.ServerKey()) {
			t.Fatalf("%s changed=%v", f, changed)
		}
	}
	if _, err := serverCert(t, dir).Verify(x509.VerifyOptions{DNSName: "10.0.0.5", Roots: caPool(t, dir)}); err != nil {
		t.Fatal(err)
	}
	noTempFiles(t, dir, filepath.Join(dir, "tls"), filepath.Join(dir, "keys"))
}

func TestServerCertRenewalKeepsNames(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	mustInit(t, InitOptions{Dir: dir, Hostnames: []string{"CTL.Example.", " [fd00::1] "}, Now: func() time.Time { return start }})
	sc := serverCert(t, dir)
	if !slices.Contains(sc.DNSNames, "ctl.example") || len(sc.IPAddresses) != 3 {
		t.Fatalf("names not normalized: %v %v", sc.DNSNames, sc.IPAddresses)
	}
	// Far from expiry: nothing to do, even without the hostname (serve passes none).
	if res := mustInit(t, InitOptions{Dir: dir, Now: func() time.Time { return start.AddDate(0, 10, 0) }}); len(res.Created) != 0 {
		t.Fatalf("re-issued too early: %v", res.Created)
	}
	// Within 30 days of expiry: re-issued, keeping the names the old certificate had.
	late := start.AddDate(0, 11, 10)
	res := mustInit(t, InitOptions{Dir: dir, Now: func() time.Time { return late }})
	if len(res.Created) != 2 {
		t.Fatalf("not renewed: %v", res.Created)
	}
	sc = serverCert(t, dir)
	if !sc.NotAfter.After(late.AddDate(0, 11, 0)) {
		t.Fatalf("renewed cert expires %v", sc.NotAfter)
	}
	if _, err := sc.Verify(x509.VerifyOptions{DNSName: "fd00::1", Roots: caPool(t, dir), CurrentTime: late}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Verify(x509.VerifyOptions{DNSName: "ctl.example", Roots: caPool(t, dir), CurrentTime: late}); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(InitOptions{Dir: dir, Hostnames: []string{"ctl.example:8443"}}); err == nil {
		t.Fatal("host:port accepted as a SAN")
	}
}

func TestInitCompletesPartialState(t *testing.T) {
	dir := t.TempDir()
	mustInit(t, InitOptions{Dir: dir})
	p := Paths{Dir: dir}
	caKey := read(t, p.CAKey())
	server := read(t, p.ServerCert())

	// ca.key without ca.crt (interrupted first run): a certificate is made for the same key
	// and the server certificate, signed by that key, stays valid.
	os.Remove(p.CACert())
	if res := mustInit(t, InitOptions{Dir: dir}); !slices.Equal(res.Created, []string{p.CACert()}) {
		t.Fatalf("created %v", res.Created)
	}
	if !bytes.Equal(read(t, p.CAKey()), caKey) || !bytes.Equal(read(t, p.ServerCert()), server) {
		t.Fatal("CA key or server cert replaced")
	}
	if _, err := serverCert(t, dir).Verify(x509.VerifyOptions{DNSName: "localhost", Roots: caPool(t, dir)}); err != nil {
		t.Fatal(err)
	}

	// server.key that does not match server.crt: re-issued.
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kb, _ := marshalKey(k)
	if err := WriteFileAtomic(p.ServerKey(), kb, 0o600); err != nil {
		t.Fatal(err)
	}
	if res := mustInit(t, InitOptions{Dir: dir}); len(res.Created) != 2 {
		t.Fatalf("mismatched server pair kept: %v", res.Created)
	}
	if _, err := ServerTLSConfig(dir); err != nil {
		t.Fatal(err)
	}

	// task-signing.key without its .pub: the public half is derived from it.
	priv, _ := LoadSigningKey(dir)
	os.Remove(p.SigningPub())
	if res := mustInit(t, InitOptions{Dir: dir}); !slices.Equal(res.Created, []string{p.SigningPub()}) {
		t.Fatalf("created %v", res.Created)
	}
	if pub, err := LoadSigningPub(p.SigningPub()); err != nil || !pub.Equal(priv.Public()) {
		t.Fatalf("derived pub: %v", err)
	}

	// A trusted public half without its private key is not silently replaced.
	os.Remove(p.SigningKey())
	if _, err := Init(InitOptions{Dir: dir}); err == nil || !strings.Contains(err.Error(), "task-signing.key is missing") {
		t.Fatalf("pub without key: %v", err)
	}
	os.Remove(p.SigningPub())
	mustInit(t, InitOptions{Dir: dir})

	// Nor is ca.crt without ca.key.
	os.Remove(p.CAKey())
	if _, err := Init(InitOptions{Dir: dir}); err == nil || !strings.Contains(err.Error(), "ca.key is missing") {
		t.Fatalf("cert without key: %v", err)
	}
	if _, err := LoadCA(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadCA without key: %v", err)
	}

	// A removed admin token is created again (the old one stays valid in the database).
	other := t.TempDir()
	mustInit(t, InitOptions{Dir: other})
	os.Remove(Paths{Dir: other}.AdminToken())
	if res := mustInit(t, InitOptions{Dir: other}); res.AdminToken == "" || len(res.Created) != 1 {
		t.Fatalf("admin token not recreated: %+v", res)
	}
}

func TestInsecureKeyModeRefused(t *testing.T) {
	dir := t.TempDir()
	mustInit(t, InitOptions{Dir: dir})
	p := Paths{Dir: dir}
	if err := os.Chmod(p.CAKey(), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Init(InitOptions{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "ca.key has mode 0644; must be 0600") {
		t.Fatalf("Init with 0644 ca.key: %v", err)
	}
	if _, err := LoadCA(dir); err == nil {
		t.Fatal("LoadCA accepted a 0644 ca.key")
	}
	os.Chmod(p.CAKey(), 0o600)

	for _, f := range []string{p.ServerKey(), p.SigningKey(), p.AdminToken()} {
		os.Chmod(f, 0o640)
		if _, err := Init(InitOptions{Dir: dir}); err == nil || !strings.Contains(err.Error(), "has mode 0640; must be 0600") {
			t.Fatalf("Init with 0640 %s: %v", f, err)
		}
		os.Chmod(f, 0o600)
	}
	os.Chmod(p.ServerKey(), 0o604)
	if _, err := ServerTLSConfig(dir); err == nil {
		t.Fatal("ServerTLSConfig accepted a world-readable key")
	}
	os.Chmod(p.SigningKey(), 0o660)
	if _, err := LoadSigningKey(dir); err == nil {
		t.Fatal("LoadSigningKey accepted a group-writable key")
	}
}

// handshake runs one TLS handshake plus a byte of traffic and returns the client CN the
// server saw and the first error of either side.
func handshake(t *testing.T, srvCfg, cliCfg *tls.Config, serverName string) (string, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		cn  string
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		name := ""
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			name = certs[0].Subject.CommonName
		}
		_, err = io.WriteString(tc, "ok")
		done <- result{name, err}
	}()
	cfg := cliCfg.Clone()
	cfg.ServerName = serverName
	conn, err := tls.Dial("tcp", ln.Addr().String(), cfg)
	if err != nil {
		<-done
		return "", err
	}
	defer conn.Close()
	buf := make([]byte, 2)
	_, cerr := io.ReadFull(conn, buf)
	r := <-done
	if r.err != nil {
		return "", r.err
	}
	return r.cn, cerr
}

func keyPair(t *testing.T, certPEM []byte, key *ecdsa.PrivateKey) tls.Certificate {
	t.Helper()
	der, _ := x509.MarshalECPrivateKey(key)
	pair, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

func TestTLSHandshakeAndClientCerts(t *testing.T) {
	dir := t.TempDir()
	mustInit(t, InitOptions{Dir: dir, Hostnames: []string{"ctl.example"}})
	srv, err := ServerTLSConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if srv.MinVersion != tls.VersionTLS12 || srv.ClientAuth != tls.VerifyClientCertIfGiven || srv.ClientCAs == nil {
		t.Fatalf("server config %+v", srv)
	}
	cli, err := ClientTLSConfig(Paths{Dir: dir}.CACert())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"localhost", "127.0.0.1", "ctl.example"} {
		if cn, err := handshake(t, srv, cli, name); err != nil || cn != "" {
			t.Fatalf("handshake as %s: cn=%q %v", name, cn, err)
		}
	}
	if _, err := handshake(t, srv, cli, "other.example"); err == nil {
		t.Fatal("handshake for a name not in the certificate succeeded")
	}
	other := t.TempDir()
	mustInit(t, InitOptions{Dir: other})
	otherCli, _ := ClientTLSConfig(Paths{Dir: other}.CACert())
	if _, err := handshake(t, srv, otherCli, "localhost"); err == nil {
		t.Fatal("client trusting another CA accepted the server")
	}

	// A host's client certificate issued by the CA is verified and its CN seen by the server.
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	certPEM, err := ca.IssueClientCert(&key.PublicKey, "node:h200-01", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cc, _ := parseCert(certPEM)
	if _, err := cc.Verify(x509.VerifyOptions{Roots: srv.ClientCAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client cert does not verify against ClientCAs: %v", err)
	}
	if _, err := cc.Verify(x509.VerifyOptions{Roots: srv.ClientCAs}); err == nil {
		t.Fatal("client cert usable as a server cert")
	}
	withCert := cli.Clone()
	withCert.Certificates = []tls.Certificate{keyPair(t, certPEM, key)}
	cn, err := handshake(t, srv, withCert, "localhost")
	if err != nil || cn != "node:h200-01" {
		t.Fatalf("mTLS handshake: cn=%q err=%v", cn, err)
	}

	// A client certificate from another CA is refused by the server.
	oca, _ := LoadCA(other)
	foreignPEM, _ := oca.IssueClientCert(&key.PublicKey, "node:h200-01", time.Hour, time.Now())
	foreign := cli.Clone()
	foreign.Certificates = []tls.Certificate{keyPair(t, foreignPEM, key)}
	if cn, err := handshake(t, srv, foreign, "localhost"); err == nil {
		t.Fatalf("foreign client cert accepted, cn=%q", cn)
	}
}

func TestIssueClientCert(t *testing.T) {
	dir := t.TempDir()
	mustInit(t, InitOptions{Dir: dir})
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	// Any key type a TLS client can use: ed25519 too.
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	certPEM, err := ca.IssueClientCert(pub, "node:x", 24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := parseCert(certPEM)
	if c.Subject.CommonName != "node:x" || !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) ||
		c.IsCA || !c.NotAfter.Equal(now.Add(24*time.Hour).Truncate(time.Second)) || c.SerialNumber.BitLen() < 64 {
		t.Fatalf("client cert %+v", c)
	}
	// Never valid past the CA.
	c2PEM, err := ca.IssueClientCert(pub, "node:x", 20*365*24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if c2, _ := parseCert(c2PEM); c2.NotAfter.After(ca.Cert.NotAfter) {
		t.Fatal("client cert outlives the CA")
	}
	if _, err := ca.IssueClientCert(pub, "", time.Hour, now); err == nil {
		t.Fatal("empty CN accepted")
	}
	if _, err := ca.IssueClientCert(pub, "x", 0, now); err == nil {
		t.Fatal("zero ttl accepted")
	}

	// From a CSR: its key is certified, its subject ignored.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "admin"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csrPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER})
	fromCSR, err := ca.IssueClientCertFromCSR(csrPEM, "node:y", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	c3, _ := parseCert(fromCSR)
	if c3.Subject.CommonName != "node:y" || !key.PublicKey.Equal(c3.PublicKey) {
		t.Fatalf("CSR cert %+v", c3)
	}
	csrDER[len(csrDER)-3] ^= 0xff // break the signature
	if _, err := ca.IssueClientCertFromCSR(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}), "node:y", time.Hour, now); err == nil {
		t.Fatal("CSR with a bad signature accepted")
	}
	if _, err := ca.IssueClientCertFromCSR([]byte("junk"), "node:y", time.Hour, now); err == nil {
		t.Fatal("junk CSR accepted")
	}
}

func TestSigningKeyRoundTrip(t *testing.T) {
	dir := t.TempDir()
	mustInit(t, InitOptions{Dir: dir})
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
	msg := []byte("task")
	if !ed25519.Verify(pub, msg, ed25519.Sign(priv, msg)) {
		t.Fatal("signature does not verify")
	}
	if _, err := LoadSigningPub(Paths{Dir: dir}.CACert()); err == nil {
		t.Fatal("a certificate accepted as a signing public key")
	}
}

func TestClientTLSConfigErrors(t *testing.T) {
	tmp := t.TempDir()
	missing := filepath.Join(tmp, "missing.crt")
	if _, err := ClientTLSConfig(missing); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Fatalf("missing CA file: %v", err)
	}
	empty := filepath.Join(tmp, "empty.crt")
	os.WriteFile(empty, []byte("not a certificate\n"), 0o644)
	if _, err := ClientTLSConfig(empty); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("CA file without certs: %v", err)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	f := filepath.Join(dir, "x.conf")
	if err := WriteFileAtomic(f, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if string(read(t, f)) != "one" || mode(t, f) != 0o644 {
		t.Fatalf("first write: %q %04o", read(t, f), mode(t, f))
	}
	if err := WriteFileAtomic(f, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if string(read(t, f)) != "two" || mode(t, f) != 0o600 {
		t.Fatalf("overwrite: %q %04o", read(t, f), mode(t, f))
	}
	if err := WriteFileAtomic(filepath.Join(dir, "nodir", "y"), []byte("z"), 0o600); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
	// A rename that fails (target is a non-empty directory) leaves no temp file behind.
	os.MkdirAll(filepath.Join(dir, "d", "sub"), 0o700)
	if err := WriteFileAtomic(filepath.Join(dir, "d"), []byte("z"), 0o600); err == nil {
		t.Fatal("replacing a directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("directory holds %v", entries)
	}
	noTempFiles(t, dir)
}

func TestTokens(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok, err := NewToken("gpa")
		if err != nil {
			t.Fatal(err)
		}
		body, ok := strings.CutPrefix(tok, "gpa_")
		if !ok || len(body) != 43 || strings.Trim(body, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			t.Fatalf("token %q", tok)
		}
		if seen[tok] {
			t.Fatalf("duplicate token %q", tok)
		}
		seen[tok] = true
	}
	if b, _ := NewToken("gpb"); !strings.HasPrefix(b, "gpb_") {
		t.Fatalf("bootstrap token %q", b)
	}
	a, _ := NewToken("gpa")
	b, _ := NewToken("gpa")
	if h := HashToken(a); h != HashToken(strings.Clone(a)) || h == HashToken(b) || len(h) != 64 || strings.Contains(h, a) {
		t.Fatal("hash not deterministic, not distinct, or not hex sha256")
	}
	if HashToken("abc") != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatal("HashToken is not hex sha256")
	}
}
