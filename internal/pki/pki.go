// Package pki creates and loads the controller's trust material: the CA, the HTTPS server
// certificate, client certificates for enrolled hosts, the ed25519 task-signing key, and API
// tokens (random secrets stored only as hashes). Secrets are written 0600, atomically.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Paths names the files of a state directory.
type Paths struct{ Dir string }

func (p Paths) CACert() string     { return filepath.Join(p.Dir, "tls", "ca.crt") }
func (p Paths) CAKey() string      { return filepath.Join(p.Dir, "tls", "ca.key") }
func (p Paths) ServerCert() string { return filepath.Join(p.Dir, "tls", "server.crt") }
func (p Paths) ServerKey() string  { return filepath.Join(p.Dir, "tls", "server.key") }
func (p Paths) SigningKey() string { return filepath.Join(p.Dir, "keys", "task-signing.key") }
func (p Paths) SigningPub() string { return filepath.Join(p.Dir, "keys", "task-signing.pub") }
func (p Paths) AdminToken() string { return filepath.Join(p.Dir, "admin.token") }

// InitOptions configures Init.
type InitOptions struct {
	Dir       string
	Hostnames []string // extra SANs; localhost, 127.0.0.1 and ::1 are always included
	Now       func() time.Time
}

// InitResult reports what Init did.
type InitResult struct {
	Created    []string // files written by this call; the others existed and were kept
	AdminToken string   // set only when admin.token was created by this call
}

var defaultSANs = []string{"localhost", "127.0.0.1", "::1"}

// Init creates whatever is missing in the state directory and keeps what exists, so it is
// safe to run on every start. The server certificate is re-issued from the existing CA when
// it is missing, does not match server.key, lacks a requested name, or expires within 30
// days; the names it already carried are kept. The admin token is created once and never
// regenerated. Every file is written atomically, private halves first, so an interrupted
// run is completed by the next one; a lone ca.crt or task-signing.pub (whose private key is
// gone) is an error rather than silently replaced, since hosts trust them. Existing secret
// files readable by group or others are refused.
func Init(opts InitOptions) (InitResult, error) {
	var res InitResult
	if opts.Dir == "" {
		return res, errors.New("pki: state directory is empty")
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	p := Paths{Dir: opts.Dir}
	sans, err := normalizeSANs(append(append([]string{}, defaultSANs...), opts.Hostnames...))
	if err != nil {
		return res, err
	}
	for _, d := range []string{opts.Dir, filepath.Join(opts.Dir, "tls"), filepath.Join(opts.Dir, "keys")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return res, fmt.Errorf("pki: %w", err)
		}
	}
	// The state dir itself may need to be traversable (an embedded PostgreSQL running as
	// another user lives under it), so an existing one is left as it is; tls/ and keys/ hold
	// only this package's files and are always 0700.
	for _, d := range []string{filepath.Join(opts.Dir, "tls"), filepath.Join(opts.Dir, "keys")} {
		if err := os.Chmod(d, 0o700); err != nil {
			return res, fmt.Errorf("pki: %w", err)
		}
	}
	for _, f := range []string{p.CAKey(), p.ServerKey(), p.SigningKey(), p.AdminToken()} {
		if err := checkSecretMode(f); err != nil {
			return res, err
		}
	}

	certExists, err := exists(p.CACert())
	if err != nil {
		return res, err
	}
	keyExists, err := exists(p.CAKey())
	if err != nil {
		return res, err
	}
	var ca *CA
	switch {
	case certExists && keyExists:
		if ca, err = LoadCA(opts.Dir); err != nil {
			return res, err
		}
	case certExists:
		// Hosts trust this certificate; silently replacing it would cut them off.
		return res, fmt.Errorf("pki: %s exists but %s is missing; restore the key, or remove both to create a new CA (enrolled hosts must then re-enroll)", p.CACert(), p.CAKey())
	case keyExists:
		// The key is written before the certificate, so this is an interrupted first run:
		// keep the key and sign a certificate for it.
		keyPEM, err := os.ReadFile(p.CAKey())
		if err != nil {
			return res, err
		}
		key, err := parseKey(keyPEM)
		if err != nil {
			return res, fmt.Errorf("pki: %s: %w", p.CAKey(), err)
		}
		if ca, err = newCA(key, now()); err != nil {
			return res, err
		}
		if err := WriteFileAtomic(p.CACert(), ca.CertPEM, 0o600); err != nil {
			return res, err
		}
		res.Created = append(res.Created, p.CACert())
	default:
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return res, err
		}
		if ca, err = newCA(key, now()); err != nil {
			return res, err
		}
		keyPEM, err := marshalKey(ca.Key)
		if err != nil {
			return res, err
		}
		if err := WriteFileAtomic(p.CAKey(), keyPEM, 0o600); err != nil {
			return res, err
		}
		if err := WriteFileAtomic(p.CACert(), ca.CertPEM, 0o600); err != nil {
			return res, err
		}
		res.Created = append(res.Created, p.CACert(), p.CAKey())
		_ = os.Remove(p.ServerCert()) // a new CA invalidates any old server cert
	}

	if reissue, keep := needServerCert(p, ca, sans, now()); reissue {
		// Names the current certificate already carries are kept, so a later run without
		// --hostname (serve renewing an expiring certificate) does not drop them.
		all, err := normalizeSANs(append(sans, keep...))
		if err != nil {
			return res, err
		}
		certPEM, keyPEM, err := ca.issueServer(all, now())
		if err != nil {
			return res, err
		}
		if err := WriteFileAtomic(p.ServerKey(), keyPEM, 0o600); err != nil {
			return res, err
		}
		if err := WriteFileAtomic(p.ServerCert(), certPEM, 0o600); err != nil {
			return res, err
		}
		res.Created = append(res.Created, p.ServerCert(), p.ServerKey())
	}

	created, err := initSigningKey(p)
	if err != nil {
		return res, err
	}
	res.Created = append(res.Created, created...)

	if _, err := os.Stat(p.AdminToken()); errors.Is(err, os.ErrNotExist) {
		tok, err := NewToken("gpa")
		if err != nil {
			return res, err
		}
		if err := WriteFileAtomic(p.AdminToken(), []byte(tok+"\n"), 0o600); err != nil {
			return res, err
		}
		res.AdminToken = tok
		res.Created = append(res.Created, p.AdminToken())
	} else if err != nil {
		return res, err
	}
	return res, nil
}

// initSigningKey creates the task-signing key pair, or only the public half when an
// interrupted run left the private key alone (the key is written first).
func initSigningKey(p Paths) ([]string, error) {
	keyExists, err := exists(p.SigningKey())
	if err != nil {
		return nil, err
	}
	pubExists, err := exists(p.SigningPub())
	if err != nil {
		return nil, err
	}
	var created []string
	var priv ed25519.PrivateKey
	switch {
	case keyExists && pubExists:
		return nil, nil
	case keyExists:
		if priv, err = LoadSigningKey(p.Dir); err != nil {
			return nil, err
		}
	case pubExists:
		// Hosts verify tasks with this public key; replacing it must be a deliberate act.
		return nil, fmt.Errorf("pki: %s exists but %s is missing; restore the key, or remove %s to create a new one (hosts must then be given the new public key)", p.SigningPub(), p.SigningKey(), p.SigningPub())
	default:
		if _, priv, err = ed25519.GenerateKey(rand.Reader); err != nil {
			return nil, err
		}
		privDER, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			return nil, err
		}
		if err := WriteFileAtomic(p.SigningKey(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
			return nil, err
		}
		created = append(created, p.SigningKey())
	}
	pubDER, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return nil, err
	}
	if err := WriteFileAtomic(p.SigningPub(), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return nil, err
	}
	return append(created, p.SigningPub()), nil
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("pki: %w", err)
	}
	return true, nil
}

// normalizeSANs trims, lower-cases DNS names, strips [brackets] from IPv6 literals, drops
// empties and duplicates, and rejects what cannot be a certificate name (host:port, URLs).
func normalizeSANs(in []string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, s := range in {
		s = strings.TrimSpace(s)
		if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
			s = s[1 : len(s)-1]
		}
		if s == "" {
			continue
		}
		if ip := net.ParseIP(s); ip != nil {
			s = ip.String()
		} else {
			s = strings.ToLower(strings.TrimSuffix(s, "."))
			if strings.ContainsAny(s, ":/@ \t") {
				return nil, fmt.Errorf("pki: %q is not a DNS name or IP address (give a bare host name, without port or scheme)", s)
			}
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out, nil
}

func checkSecretMode(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("pki: %s has mode %04o; must be 0600 (chmod 600 %s)", path, fi.Mode().Perm(), path)
	}
	return nil
}

// CA is a loaded certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

func newCA(key crypto.Signer, now time.Time) (*CA, error) {
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "gpuaas controller CA", Organization: []string{"gpuaas"}},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// LoadCA loads ca.crt and ca.key from a state directory.
func LoadCA(dir string) (*CA, error) {
	p := Paths{Dir: dir}
	certPEM, err := os.ReadFile(p.CACert())
	if err != nil {
		return nil, err
	}
	if err := checkSecretMode(p.CAKey()); err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(p.CAKey())
	if err != nil {
		return nil, err
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", p.CACert(), err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", p.CAKey(), err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", p.CACert())
	}
	if pk, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pk.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("pki: %s does not match %s", p.CAKey(), p.CACert())
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

func (ca *CA) issueServer(sans []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: "gpuaas-controller"},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, s := range sans {
		if ip := net.ParseIP(s); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if s != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, s)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: issue server cert: %w", err)
	}
	keyPEM, err = marshalKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// IssueClientCert signs a client-auth certificate (ExtKeyUsageClientAuth) for pub with
// CommonName cn, valid from now (less 5 minutes of clock skew) for ttl, but never past the
// CA's own expiry. It returns the certificate as PEM.
func (ca *CA) IssueClientCert(pub crypto.PublicKey, cn string, ttl time.Duration, now time.Time) ([]byte, error) {
	if cn == "" || ttl <= 0 {
		return nil, errors.New("pki: client cert needs a common name and a positive ttl")
	}
	notAfter := now.Add(ttl)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("pki: the CA expired at %s", ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: issue client cert: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// IssueClientCertFromCSR checks a PEM "CERTIFICATE REQUEST" (its self-signature proves the
// requester holds the private key) and certifies its public key. The CSR's subject is
// ignored: cn is what the caller has authenticated.
func (ca *CA) IssueClientCertFromCSR(csrPEM []byte, cn string, ttl time.Duration, now time.Time) ([]byte, error) {
	blk, _ := pem.Decode(csrPEM)
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("pki: no PEM \"CERTIFICATE REQUEST\" block")
	}
	csr, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("pki: certificate request signature: %w", err)
	}
	return ca.IssueClientCert(csr.PublicKey, cn, ttl, now)
}

// renewBefore is how long before expiry Init re-issues the server certificate.
const renewBefore = 30 * 24 * time.Hour

// needServerCert reports whether the server certificate must be (re-)issued, and the names
// the current one carries when it is still a certificate of this CA.
func needServerCert(p Paths, ca *CA, sans []string, now time.Time) (bool, []string) {
	b, err := os.ReadFile(p.ServerCert())
	if err != nil {
		return true, nil
	}
	cert, err := parseCert(b)
	if err != nil || cert.CheckSignatureFrom(ca.Cert) != nil {
		return true, nil
	}
	keep := slices.Clone(cert.DNSNames)
	for _, ip := range cert.IPAddresses {
		keep = append(keep, ip.String())
	}
	// A crash between writing server.key and server.crt leaves a mismatched pair.
	if _, err := tls.LoadX509KeyPair(p.ServerCert(), p.ServerKey()); err != nil {
		return true, keep
	}
	if now.Add(renewBefore).After(cert.NotAfter) {
		return true, keep
	}
	for _, s := range sans {
		if ip := net.ParseIP(s); ip != nil {
			if !slices.ContainsFunc(cert.IPAddresses, func(c net.IP) bool { return c.Equal(ip) }) {
				return true, keep
			}
		} else if !slices.Contains(cert.DNSNames, s) {
			return true, keep
		}
	}
	return false, nil
}

func marshalKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("key cannot sign")
	}
	return s, nil
}

// ServerTLSConfig serves the state directory's server certificate. Client certificates
// signed by the CA are verified when offered (hosts use mTLS; users use bearer tokens).
func ServerTLSConfig(dir string) (*tls.Config, error) {
	p := Paths{Dir: dir}
	if err := checkSecretMode(p.ServerKey()); err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(p.ServerCert(), p.ServerKey())
	if err != nil {
		return nil, fmt.Errorf("pki: server certificate: %w", err)
	}
	caPEM, err := os.ReadFile(p.CACert())
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("pki: %s holds no certificate", p.CACert())
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    pool,
	}, nil
}

// ClientTLSConfig trusts the CA in caFile.
func ClientTLSConfig(caFile string) (*tls.Config, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("pki: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("pki: %s holds no PEM certificate", caFile)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}, nil
}

// LoadSigningKey loads the task-signing private key.
func LoadSigningKey(dir string) (ed25519.PrivateKey, error) {
	p := Paths{Dir: dir}
	if err := checkSecretMode(p.SigningKey()); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p.SigningKey())
	if err != nil {
		return nil, err
	}
	k, err := parseKey(b)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", p.SigningKey(), err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: %s is not an ed25519 key", p.SigningKey())
	}
	return ek, nil
}

// LoadSigningPub loads an ed25519 public key (PKIX PEM).
func LoadSigningPub(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("pki: %s: no PEM block", path)
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	ek, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("pki: %s is not an ed25519 public key", path)
	}
	return ek, nil
}

// WriteFileAtomic writes data to path with mode perm: temp file in the same directory,
// fsync, rename, fsync the directory. A crash leaves the old file or the new, never half.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
