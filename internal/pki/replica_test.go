package pki

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

// A replica's client certificate: minted from the CA, CN "controller:<name>", client auth
// only, short-lived, reused until near expiry, and verifiable against the CA.
func TestReplicaTLSConfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ca.ReplicaTLSConfig("10.0.0.11:8443")
	if err != nil {
		t.Fatal(err)
	}
	c1, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := c1.Leaf
	if leaf.Subject.CommonName != ControllerCNPrefix+"10.0.0.11:8443" || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Fatalf("certificate %s %v", leaf.Subject.CommonName, leaf.ExtKeyUsage)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > 25*time.Hour {
		t.Fatalf("lives %s, want about a day", life)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("not verifiable against the CA: %v", err)
	}
	if c2, _ := cfg.GetClientCertificate(&tls.CertificateRequestInfo{}); c2 != c1 {
		t.Fatal("re-minted while the certificate is fresh")
	}
	if cfg.RootCAs == nil || !cfg.RootCAs.Equal(pool) {
		t.Fatal("the replica client does not trust exactly the CA")
	}
	for _, name := range []string{"", "a\nb"} {
		if _, err := ca.ReplicaTLSConfig(name); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
	if _, err := (&CA{Cert: ca.Cert}).ReplicaTLSConfig("x"); err == nil || !strings.Contains(err.Error(), "CA key") {
		t.Fatalf("without the CA key: %v", err)
	}
}
