package wipeproof

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/task"
)

func enrolled(t *testing.T, ca *pki.CA, node string) (Signer, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.IssueClientCert(&key.PublicKey, "node:"+node, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return Signer{Key: key, CertDER: blk.Bytes}, strings.TrimLeft(cert.SerialNumber.Text(16), "0")
}

// Every field a proof's worth rests on is bound by the signature or checked against what the
// controller knows; each tampering is refused with its reason.
func TestVerifyRefusesEachTampering(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(pki.InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	s, serial := enrolled(t, ca, "node-a")
	serials := map[string]string{}
	expect := Expect{NodeID: "node-a", TaskID: "task-1", SlotID: "slot-1", Roots: roots, Enrolled: func(sn string) (string, error) {
		if n, ok := serials[strings.TrimLeft(sn, "0")]; ok {
			return n, nil
		}
		return "", errors.New("not enrolled")
	}}
	serials[serial] = "node-a"
	good := task.WipeProof{Verified: true, Method: "nvme-sanitize-crypto-erase", Details: []byte(`{"identity":{"serial":"S1","source":"nvme id-ctrl/id-ns"}}`)}
	if err := Sign(s, &good, "slot-1", "node-a", "task-1", "alloc-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	chk, err := Verify(good, expect)
	if err != nil || chk.Document.SlotID != "slot-1" || chk.SignerSerial == "" {
		t.Fatalf("a good proof: %+v, %v", chk, err)
	}
	b, _ := enrolled(t, ca, "node-b")
	tamper := map[string]func(p *task.WipeProof){
		"unsigned":        func(p *task.WipeProof) { p.Signature = "" },
		"document edited": func(p *task.WipeProof) { p.Document = strings.Replace(p.Document, `"S1"`, `"S2"`, 1) },
		"verdict flipped outside the document": func(p *task.WipeProof) {
			p.Method = "wipefs+blkdiscard-zeroout"
		},
		"another node's certificate": func(p *task.WipeProof) {
			_ = Sign(b, p, "slot-1", "node-a", "task-1", "alloc-1", time.Now())
		},
		"not enrolled": func(p *task.WipeProof) { delete(serials, serial) },
		"another slot": func(p *task.WipeProof) { _ = Sign(s, p, "slot-2", "node-a", "task-1", "alloc-1", time.Now()) },
		"another task": func(p *task.WipeProof) { _ = Sign(s, p, "slot-1", "node-a", "task-0", "alloc-1", time.Now()) },
		"garbage certificate": func(p *task.WipeProof) {
			p.SignerCert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
		},
	}
	for name, f := range tamper {
		p := good
		f(&p)
		if _, err := Verify(p, expect); err == nil {
			t.Errorf("%s: accepted", name)
		}
		serials[serial] = "node-a"
	}
}
