package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func (a *Agent) loadCert() error {
	c, err := tls.LoadX509KeyPair(a.cfg.CertFile, a.cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("node certificate: %w", err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return err
		}
	}
	a.cert.Store(&c)
	return nil
}

// maybeRenew rotates the node certificate once less than a third of its life remains.
func (a *Agent) maybeRenew(ctx context.Context) {
	leaf := a.cert.Load().Leaf
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	if time.Until(leaf.NotAfter) > life/3 {
		return
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return
	}
	pubDER, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	resp, data, err := a.do(ctx, "POST", "/api/v1/agent/renew", apiv1.EnrollRequest{
		PublicKeyPEM: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))})
	if err != nil || resp.StatusCode != http.StatusCreated {
		a.log.Warn("certificate renewal failed; will retry", "err", err, "not_after", leaf.NotAfter)
		return
	}
	var en apiv1.Enrollment
	if err := json.Unmarshal(data, &en); err != nil {
		return
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	if err := mkdirWrite(a.cfg.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})); err != nil {
		a.log.Error("writing renewed key", "err", err)
		return
	}
	if err := mkdirWrite(a.cfg.CertFile, []byte(en.CertificatePEM)); err != nil {
		a.log.Error("writing renewed certificate", "err", err)
		return
	}
	if err := a.loadCert(); err != nil {
		a.log.Error("loading renewed certificate", "err", err)
		return
	}
	a.freshConnections()
	a.log.Info("node certificate renewed", "not_after", en.NotAfter)
}

// freshConnections makes later requests dial new TLS connections, which present the current
// certificate: kept-alive ones (a busy long poll's never idles) still carry the superseded
// one, which the controller stops accepting after a short grace.
func (a *Agent) freshConnections() {
	old := a.hc.Load()
	tr, ok := old.Transport.(*http.Transport)
	if !ok {
		return
	}
	a.hc.Store(&http.Client{Transport: tr.Clone()})
	tr.CloseIdleConnections() // in-flight requests finish on the old transport
}
