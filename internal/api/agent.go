package api

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Node credentials live 30 days; hostd renews well before expiry.
const (
	nodeCertTTL       = 30 * 24 * time.Hour
	bootstrapTokenTTL = 24 * time.Hour
	maxPollWait       = 60 * time.Second
	maxPollTasks      = 64 // tasks one poll may lease
	heartbeatCoalesce = 5 * time.Second
	enrollPath        = "/api/v1/agent/enroll"
)

// authenticateNode accepts only a verified client certificate issued by our CA to a node
// (CN "node:<id>") whose serial is recorded and not revoked or expired.
func (s *Server) authenticateNode(r *http.Request) (Principal, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return Principal{}, errUnauthorized("agent endpoints need the node's mTLS client certificate")
	}
	cert := r.TLS.PeerCertificates[0]
	id, ok := strings.CutPrefix(cert.Subject.CommonName, "node:")
	if !ok {
		return Principal{}, errForbidden("client certificate is not a node identity")
	}
	serial := hex.EncodeToString(cert.SerialNumber.Bytes())
	nodeID, cached, gen := s.nodeCerts.get(serial)
	if !cached {
		var err error
		nodeID, err = s.store.CredentialNode(r.Context(), serial)
		if errors.Is(err, store.ErrNotFound) {
			return Principal{}, errUnauthorized("node certificate unknown, revoked or expired; enroll again")
		}
		if err != nil {
			return Principal{}, err
		}
		s.nodeCerts.put(serial, nodeID, gen)
	}
	if nodeID != id {
		return Principal{}, errForbidden("certificate does not match its node")
	}
	return Principal{TokenID: "cert:" + hex.EncodeToString(cert.SerialNumber.Bytes()), Name: "node:" + id, Role: "node", NodeID: id}, nil
}

// issueBootstrapToken creates a one-time enrollment token for a node (in the caller's tx).
func issueBootstrapToken(r *http.Request, tx *store.Tx, nodeID string) (string, time.Time, error) {
	tok, err := pki.NewToken("gpb")
	if err != nil {
		return "", time.Time{}, err
	}
	exp := time.Now().Add(bootstrapTokenTTL).UTC()
	return tok, exp, tx.CreateBootstrapToken(r.Context(), nodeID, pki.HashToken(tok), exp)
}

func (s *Server) newBootstrapToken(w http.ResponseWriter, r *http.Request, p Principal) error {
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	var out apiv1.BootstrapToken
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		out.NodeID = id
		if out.Token, out.ExpiresAt, err = issueBootstrapToken(r, tx, id); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "node.bootstrap_token", "node", id, map[string]any{"expires_at": out.ExpiresAt}))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func parsePublicKey(pemText string) (any, error) {
	blk, _ := pem.Decode([]byte(pemText))
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, errInvalid("public_key_pem must be a PEM \"PUBLIC KEY\" block")
	}
	pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, errInvalid("public_key_pem: %v", err)
	}
	return pub, nil
}

// issueNodeCert signs a node certificate and records its serial (in the caller's tx).
func (s *Server) issueNodeCert(r *http.Request, tx *store.Tx, nodeID string, pub any) (apiv1.Enrollment, error) {
	now := time.Now()
	certPEM, err := s.ca.IssueClientCert(pub, "node:"+nodeID, nodeCertTTL, now)
	if err != nil {
		return apiv1.Enrollment{}, errInvalid("cannot certify this key: %v", err)
	}
	blk, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return apiv1.Enrollment{}, err
	}
	if err := tx.RecordCredential(r.Context(), hex.EncodeToString(cert.SerialNumber.Bytes()), nodeID, cert.NotAfter); err != nil {
		return apiv1.Enrollment{}, err
	}
	return apiv1.Enrollment{NodeID: nodeID, CertificatePEM: string(certPEM), CAPEM: string(s.ca.CertPEM),
		TaskSigningPublicKeyPEM: string(s.signingPub), NotAfter: cert.NotAfter}, nil
}

// enroll exchanges a one-time bootstrap token for a node certificate.
func (s *Server) enroll(w http.ResponseWriter, r *http.Request, _ Principal) error {
	if s.ca == nil {
		return apiErr(apiv1.CodeUnavailable, "enrollment is not configured on this controller", nil)
	}
	var req apiv1.EnrollRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	pub, err := parsePublicKey(req.PublicKeyPEM)
	if err != nil {
		return err
	}
	switch req.Runtime {
	case "", "libvirt", "lab", "sim":
	default:
		return apiErr(apiv1.CodeInvalidRequest, "runtime must be libvirt, lab or sim", map[string]any{"field": "runtime"})
	}
	var out apiv1.Enrollment
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		nodeID, err := tx.ConsumeBootstrapToken(r.Context(), pki.HashToken(strings.TrimSpace(req.BootstrapToken)), time.Now())
		switch {
		case errors.Is(err, store.ErrNotFound):
			return errUnauthorized("unknown bootstrap token")
		case errors.Is(err, store.ErrTokenSpent):
			return errUnauthorized("bootstrap token already used or expired; ask an admin for a new one (gpuaasctl nodes bootstrap-token NODE)")
		case err != nil:
			return err
		}
		if out, err = s.issueNodeCert(r, tx, nodeID, pub); err != nil {
			return err
		}
		simulated := req.Runtime == "sim" || req.LabHost
		if err := tx.RecordEnrollmentRuntime(r.Context(), nodeID, simulated); err != nil {
			return err
		}
		return tx.Audit(r.Context(), store.AuditRecord{Actor: "node:" + nodeID, ActorRole: "node", Action: "node.enroll",
			TargetKind: "node", TargetID: nodeID, RequestID: requestID(r.Context()),
			Details: map[string]any{"cert_not_after": out.NotAfter, "runtime": req.Runtime, "lab_host": req.LabHost, "simulated": simulated}})
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// renew issues a fresh certificate to an enrolled node (rotation before expiry).
func (s *Server) renew(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.EnrollRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	pub, err := parsePublicKey(req.PublicKeyPEM)
	if err != nil {
		return err
	}
	oldSerial, _ := strings.CutPrefix(p.TokenID, "cert:")
	supersededAt := s.secCfg.Now().Add(s.secCfg.RenewGrace).UTC()
	var out apiv1.Enrollment
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = s.issueNodeCert(r, tx, p.NodeID, pub); err != nil {
			return err
		}
		// The presenting certificate is superseded: it ends after a short grace, not at its
		// own expiry (a renewed host holds one live identity, not two).
		if err := tx.SupersedeCredential(r.Context(), oldSerial, p.NodeID, supersededAt); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "node.renew", "node", p.NodeID, map[string]any{"cert_not_after": out.NotAfter,
			"superseded_serial": oldSerial, "superseded_at": supersededAt}))
	})
	if err != nil {
		return err
	}
	s.nodeCerts.drop(oldSerial) // re-checked against the database from now on
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) pollTasks(w http.ResponseWriter, r *http.Request, p Principal) error {
	wait, err := queryDuration(r, "wait", 30*time.Second, maxPollWait)
	if err != nil {
		return err
	}
	n, batch, err := queryInt(r, "max", 1, maxPollTasks)
	if err != nil {
		return err
	}
	if batch {
		// Batch form: up to max tasks as {"tasks": [envelope, ...]}.
		envs, err := s.dispatch.PollMany(r.Context(), p.NodeID, wait, n)
		if err != nil {
			return err
		}
		if len(envs) == 0 {
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
		writeJSON(w, http.StatusOK, task.Batch{Tasks: envs})
		return nil
	}
	env, err := s.dispatch.Poll(r.Context(), p.NodeID, wait)
	if err != nil {
		return err
	}
	if env == nil {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	writeJSON(w, http.StatusOK, env)
	return nil
}

func (s *Server) taskResult(w http.ResponseWriter, r *http.Request, p Principal) error {
	var res task.Result
	if err := decode(w, r, &res); err != nil {
		return err
	}
	if res.TaskID != "" && res.TaskID != r.PathValue("id") {
		return errInvalid("task_id in the body does not match the path")
	}
	tr, err := s.dispatch.Result(r.Context(), p.NodeID, r.PathValue("id"), res)
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("task " + r.PathValue("id") + " not found for this node")
	}
	if err != nil {
		return err
	}
	if tr.Type == string(task.TypeTerminalOpen) && tr.Status != "succeeded" {
		// The host could not open the session (guest down, key not pinned, ...): tell the
		// waiting client now rather than when its ticket times out.
		var tp task.TerminalOpen
		if json.Unmarshal(tr.Payload, &tp) == nil {
			s.endSessions(r.Context(), "fail", tp.SessionID, "the host could not open the session: "+tr.Error)
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"task_id": tr.ID, "status": tr.Status})
	return nil
}

func (s *Server) taskProgress(w http.ResponseWriter, r *http.Request, p Principal) error {
	var pr task.Progress
	if err := decode(w, r, &pr); err != nil {
		return err
	}
	err := s.dispatch.Progress(r.Context(), p.NodeID, r.PathValue("id"), pr)
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(apiv1.CodeConflict, "task is not leased to this node (finished, expired or re-leased)", nil)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// heartbeats buffers the latest heartbeat per node; a flusher writes them all in one
// statement, so 10,000 hosts cost one UPDATE per flush interval rather than one each.
type heartbeats struct {
	mu      sync.Mutex
	pending map[string]store.HeartbeatRecord
	wake    chan struct{}
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request, p Principal) error {
	var hb apiv1.Heartbeat
	if err := decode(w, r, &hb); err != nil {
		return err
	}
	facts, err := json.Marshal(hb)
	if err != nil {
		return err
	}
	s.hb.mu.Lock()
	_, seen := s.hb.pending[p.NodeID]
	s.hb.pending[p.NodeID] = store.HeartbeatRecord{NodeID: p.NodeID, At: time.Now(), Facts: facts, Firmware: hb.FirmwareProfile}
	s.hb.mu.Unlock()
	if !seen {
		select { // the first heartbeat in a window flushes soon: a new host shows up fast
		case s.hb.wake <- struct{}{}:
		default:
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// FlushHeartbeats writes buffered heartbeats now.
func (s *Server) FlushHeartbeats(ctx context.Context) error {
	s.hb.mu.Lock()
	batch := make([]store.HeartbeatRecord, 0, len(s.hb.pending))
	for _, h := range s.hb.pending {
		batch = append(batch, h)
	}
	s.hb.pending = map[string]store.HeartbeatRecord{}
	s.hb.mu.Unlock()
	err := s.store.RecordHeartbeats(ctx, batch)
	if err != nil {
		// Not written: back into the buffer for the next flush, unless the node has sent a
		// newer heartbeat since.
		s.hb.mu.Lock()
		for _, h := range batch {
			if _, newer := s.hb.pending[h.NodeID]; !newer {
				s.hb.pending[h.NodeID] = h
			}
		}
		s.hb.mu.Unlock()
	}
	return err
}

// RunBackground runs the API's background work until ctx ends: the heartbeat flusher, the
// terminal-ticket sweep, and the listeners that apply other replicas' revocations and
// session ends.
func (s *Server) RunBackground(ctx context.Context) {
	go s.listenReplicas(ctx)
	t := time.NewTicker(heartbeatCoalesce)
	defer t.Stop()
	sweep := time.NewTicker(30 * time.Second)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = s.FlushHeartbeats(context.Background())
			return
		case <-t.C:
		case <-s.hb.wake:
		case <-sweep.C:
			// Terminal tickets nobody used end as "not attached in time".
			if _, err := s.store.ExpireSessions(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("expiring terminal sessions", "err", err)
			}
			continue
		}
		if err := s.FlushHeartbeats(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("heartbeat flush", "err", err)
		}
	}
}

func (s *Server) listTasks(w http.ResponseWriter, r *http.Request, _ Principal) error {
	q := r.URL.Query()
	f := store.TaskFilter{AllocationID: q.Get("allocation")}
	if n := q.Get("node"); n != "" {
		node, err := s.store.GetNode(r.Context(), n)
		if err != nil {
			return err
		}
		f.NodeID = node.ID
	}
	items, err := s.store.ListTasks(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[store.TaskRecord]{Items: items})
	return nil
}

func (s *Server) getTask(w http.ResponseWriter, r *http.Request, _ Principal) error {
	tr, err := s.store.GetTask(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound(fmt.Sprintf("task %s not found", r.PathValue("id")))
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, tr)
	return nil
}
