package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"sync"
	"time"
)

// ControllerCNPrefix marks a client certificate as a controller replica's identity. Only the
// holder of the CA key (every replica, nothing else) can mint one: enrollment and renewal
// certify hosts as "node:<id>" whatever their request asks for.
const ControllerCNPrefix = "controller:"

// replicaCertTTL is how long a replica's in-memory client certificate lives; it is
// re-issued well before it lapses and never written to disk.
const replicaCertTTL = 24 * time.Hour

// ReplicaTLSConfig is a replica's client configuration for reaching another replica: it
// trusts only the CA and presents a short-lived client certificate with CN
// "controller:<name>", minted in memory from the CA key (no file to copy or leak) and
// re-minted an hour before it expires.
func (ca *CA) ReplicaTLSConfig(name string) (*tls.Config, error) {
	if ca == nil || ca.Key == nil {
		return nil, errors.New("pki: replica credentials need the CA key")
	}
	if name == "" || strings.ContainsAny(name, "\r\n") {
		return nil, errors.New("pki: replica credentials need a name")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	var mu sync.Mutex
	var cur *tls.Certificate
	get := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if cur != nil && now.Add(time.Hour).Before(cur.Leaf.NotAfter) {
			return cur, nil
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		certPEM, err := ca.IssueClientCert(&key.PublicKey, ControllerCNPrefix+name, replicaCertTTL, now)
		if err != nil {
			return nil, err
		}
		blk, _ := pem.Decode(certPEM)
		leaf, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		cur = &tls.Certificate{Certificate: [][]byte{blk.Bytes}, PrivateKey: key, Leaf: leaf}
		return cur, nil
	}
	if _, err := get(nil); err != nil { // fail at startup, not on the first relay
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, GetClientCertificate: get}, nil
}
