package controller

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// --webhook-ca-file must hold a PEM certificate; a missing or empty file stops the start
// instead of silently trusting only the system roots.
func TestWebhookCAFile(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hooks CA"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "ca.pem")
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(good, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("not pem\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := webhookDeliverer(Config{WebhookCAFile: good}, nil, nil); err != nil {
		t.Fatalf("good CA file: %v", err)
	}
	for file, want := range map[string]string{empty: "no PEM certificate", filepath.Join(dir, "missing.pem"): "no such file"} {
		if _, err := webhookDeliverer(Config{WebhookCAFile: file}, nil, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", file, err, want)
		}
	}
}
