package fanout

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/task"
)

// certTTL outlives any run.
const certTTL = 24 * time.Hour

// identity is what enrollment would have given a host: its node certificate and key, and
// the serial the controller must find in node_credentials.
type identity struct {
	nodeID   string
	cert     tls.Certificate
	serial   string // hex, as authenticateNode spells it
	notAfter time.Time
}

// issueIdentities certifies a fresh ECDSA P-256 key per node with CN "node:<id>".
func issueIdentities(ca *pki.CA, nodeIDs []string, now time.Time) ([]identity, error) {
	out := make([]identity, 0, len(nodeIDs))
	for _, id := range nodeIDs {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		certPEM, err := ca.IssueClientCert(key.Public(), "node:"+id, certTTL, now)
		if err != nil {
			return nil, err
		}
		blk, _ := pem.Decode(certPEM)
		if blk == nil {
			return nil, errors.New("issued certificate is not PEM")
		}
		leaf, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, identity{nodeID: id, serial: hex.EncodeToString(leaf.SerialNumber.Bytes()), notAfter: leaf.NotAfter,
			cert: tls.Certificate{Certificate: [][]byte{blk.Bytes}, PrivateKey: key, Leaf: leaf}})
	}
	return out, nil
}

// host is one simulated hostd: its own transport (so its own TLS connection), built as
// hostd builds it (HTTP/1.1, the pinned CA, its node certificate), polling in a loop.
type host struct {
	id     identity
	hc     *http.Client
	url    string
	wait   time.Duration
	verify *task.Verifier
	l      *ledger
}

func newHost(id identity, server, caFile string, wait time.Duration, v *task.Verifier, l *ledger) (*host, error) {
	tlsCfg, err := pki.ClientTLSConfig(caFile)
	if err != nil {
		return nil, err
	}
	tlsCfg.Certificates = []tls.Certificate{id.cert}
	return &host{id: id, hc: &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, MaxIdleConnsPerHost: 4}},
		url: server + "/api/v1/agent/tasks?wait=" + wait.String(), wait: wait, verify: v, l: l}, nil
}

// run polls until ctx ends. sent is called once, when the first poll is on the wire (its
// TLS handshake done), or when that first poll fails.
func (h *host) run(ctx context.Context, sent func()) {
	defer h.hc.CloseIdleConnections()
	sent = sync.OnceFunc(sent)
	first := true
	for ctx.Err() == nil {
		err := h.poll(ctx, first, sent)
		if first {
			first = false
			sent() // a no-op unless the first poll failed before it was written
		}
		if err != nil && ctx.Err() == nil {
			h.l.pollError(fmt.Errorf("node %s: %w", h.id.nodeID, err))
			select { // hostd backs off too
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (h *host) poll(ctx context.Context, first bool, sent func()) error {
	pctx, cancel := context.WithTimeout(ctx, h.wait+15*time.Second)
	defer cancel()
	if first {
		pctx = httptrace.WithClientTrace(pctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { sent() }})
	}
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, h.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "gpuaas-hostd/bench")
	resp, err := h.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	switch resp.StatusCode {
	case http.StatusNoContent:
		h.l.pollEmpty(time.Now())
		return nil
	case http.StatusOK:
		var env task.Envelope
		if err := json.Unmarshal(data, &env); err != nil {
			return fmt.Errorf("task envelope: %w", err)
		}
		at := time.Now()
		_, verr := h.verify.Verify(&env)
		h.l.receive(env.TaskID, at, verr == nil)
		return nil
	}
	return fmt.Errorf("%s: %.200s", resp.Status, data)
}
