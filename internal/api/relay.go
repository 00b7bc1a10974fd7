package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// Cross-replica terminal sessions. The replica that opens a session splices it in memory
// (its Hub) and records its advertised URL as the session's owner. Either end may attach to
// any replica: that replica authenticates and authorizes the caller exactly as for a local
// attach (spending the single-use token), then, when it is not the owner, carries the
// upgraded connection byte for byte to the owner's replica endpoint over TLS, presenting a
// controller certificate (pki.ReplicaTLSConfig). The owner alone counts, records and audits.

// replicaTerminalPath is the owner's endpoint for a relayed end ({side}: client or host).
const replicaTerminalPath = "/api/v1/replica/terminal/"

// replicaRecordingPath is the owner's endpoint serving a recording it wrote.
const replicaRecordingPath = "/api/v1/replica/recordings/"

// relayDialTimeout bounds reaching the owner (TCP, TLS, and its answer to the upgrade).
const relayDialTimeout = 10 * time.Second

// TerminalChannel is the PostgreSQL NOTIFY channel on which a replica asks every replica to
// end sessions it may hold: "release <allocation>" (the allocation started releasing) or
// "fail <session> <reason>" (its host could not open it; the result reached this replica).
const TerminalChannel = "gpuaas_terminal"

// endSessions ends sessions here and, through TerminalChannel, on the replica that holds them
// (a replica's own notification comes back to it too, and ending twice changes nothing).
func (s *Server) endSessions(ctx context.Context, kind, id, reason string) {
	s.applyEnd(kind + " " + id + " " + reason)
	if len(reason) > 1000 {
		reason = reason[:1000] // NOTIFY payloads are bounded (8000 bytes)
	}
	if err := s.store.Notify(ctx, TerminalChannel, kind+" "+id+" "+reason); err != nil {
		s.log.Warn("terminal session end not broadcast to other replicas; a session they hold ends at its idle timeout or ticket expiry", "kind", kind, "id", id, "err", err)
	}
}

func (s *Server) applyEnd(payload string) {
	kind, rest, _ := strings.Cut(payload, " ")
	id, reason, _ := strings.Cut(rest, " ")
	switch kind {
	case "release":
		if n := s.term.CloseAllocation(id); n > 0 {
			s.log.Info("terminal sessions closed: the allocation is releasing", "allocation", id, "sessions", n)
		}
	case "fail":
		s.term.Fail(id, reason)
	}
}

// authenticateController accepts only a verified client certificate with a controller
// identity (CN "controller:<name>"), which only holders of the CA key can mint.
func (s *Server) authenticateController(r *http.Request) (Principal, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return Principal{}, errUnauthorized("replica endpoints need a controller's client certificate")
	}
	cn := r.TLS.PeerCertificates[0].Subject.CommonName
	name, ok := strings.CutPrefix(cn, pki.ControllerCNPrefix)
	if !ok || name == "" {
		return Principal{}, errForbidden("client certificate is not a controller identity")
	}
	return Principal{Name: cn, Role: "controller"}, nil
}

// ownsSession reports whether this replica splices the session ("" owner: a session of a
// controller without an advertised URL, spliced where it was opened, as before relaying).
func (s *Server) ownsSession(rec store.TerminalSessionRecord) bool {
	return rec.OwnerURL == "" || rec.OwnerURL == s.advertise
}

// relayEnd carries an authenticated, authorized end of a session (side client or host) to
// the replica that owns it. The owner answers before the caller's connection is upgraded, so
// its refusal (the session timed out there, say) reaches the caller as a plain API error.
func (s *Server) relayEnd(w http.ResponseWriter, r *http.Request, p Principal, rec store.TerminalSessionRecord, side string) error {
	if s.replicaTLS == nil {
		return apiErr(apiv1.CodeConflict, fmt.Sprintf("session %s is held by controller replica %s and this replica cannot relay (no replica credentials)", rec.ID, rec.OwnerURL), nil)
	}
	ctx, cancel := context.WithTimeout(r.Context(), relayDialTimeout)
	defer cancel()
	h := http.Header{}
	h.Set("X-Request-Id", requestID(r.Context()))
	h.Set("User-Agent", "gpuaas-controller/"+s.version+" (relay from "+s.advertise+")")
	up, err := terminal.Dial(ctx, s.replicaTLS, rec.OwnerURL, replicaTerminalPath+rec.ID+"/"+side, h)
	var refused *terminal.RefusedError
	if errors.As(err, &refused) {
		var ae apiv1.Error
		if json.Unmarshal(refused.Body, &ae) == nil && ae.Code != "" {
			return &ae
		}
		err = fmt.Errorf("answered %s", refused.Status)
	}
	if err != nil {
		// The owner is down or cut off: the session cannot run (its token is spent and its
		// splice lives only there). End it and say so; a new session opens on a live replica.
		reason := "owning controller replica unreachable: " + rec.OwnerURL
		s.ownerLost(r, p, rec, side, reason, err)
		return apiErr(apiv1.CodeUnavailable, fmt.Sprintf("session %s is held by controller replica %s, which is unreachable (%v); the session has ended: open a new one",
			rec.ID, rec.OwnerURL, err), map[string]any{"retryable": false, "owner": rec.OwnerURL})
	}
	conn, rw, err := s.upgrade(w, r)
	if err != nil {
		up.Close()
		return err
	}
	s.log.Info("terminal end relayed to its owning replica", "session", rec.ID, "side", side, "owner", rec.OwnerURL, "caller", p.Name)
	framedClient := side == "client" && rec.Mode != terminal.ModeStdio
	end := terminal.Relay(terminal.BufferedConn{Conn: conn, R: rw.Reader}, up, func(cw io.Writer, e terminal.RelayEnd) {
		if !framedClient || e.SawExit {
			return // the owner ended the session and said so (or the bytes are raw SSH)
		}
		// A live owner always sends a framed client an exit frame before closing: this is
		// the owner going away mid-session (killed, crashed, cut off).
		_ = terminal.WriteFrame(cw, terminal.FrameExit, terminal.Exit(255,
			"the controller replica holding this session ("+rec.OwnerURL+") went away; the session has ended"))
		s.ownerLost(r, p, rec, side, "owning controller replica lost: "+rec.OwnerURL, e.Err)
	})
	if end.OwnerEnded && !framedClient && s.ownerGone(r.Context(), rec) {
		s.ownerLost(r, p, rec, side, "owning controller replica lost: "+rec.OwnerURL, end.Err)
	}
	s.log.Info("relayed terminal end closed", "session", rec.ID, "side", side, "owner_ended", end.OwnerEnded, "err", end.Err)
	return nil
}

// ownerGone decides, for an end whose stream carries no exit frame (raw bytes, a host's
// side), whether the owner closing it was the owner going away: a live owner records the
// session's end within moments of closing it (a stopping one within EndAllSessions' 10 s);
// if it has not after 15 s and does not answer /healthz, it is gone. The caller's
// connection is already closed: only the record waits.
func (s *Server) ownerGone(ctx context.Context, rec store.TerminalSessionRecord) bool {
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if cur, err := s.store.GetSession(ctx, rec.ID, ""); err == nil && cur.Status == "ended" {
			return false
		}
		t := time.NewTimer(200 * time.Millisecond)
		<-t.C
	}
	return !s.replicaAlive(ctx, rec.OwnerURL)
}

// replicaAlive reports whether the replica at url answers /healthz within a few seconds.
func (s *Server) replicaAlive(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	tr := &http.Transport{TLSClientConfig: s.replicaTLS.Clone()}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(url, "/")+"/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// ownerLost ends a session whose owner cannot be reached (unless the owner recorded its end
// already) and audits it once, by the replica that found out.
func (s *Server) ownerLost(r *http.Request, p Principal, rec store.TerminalSessionRecord, side, reason string, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	details := map[string]any{"session_id": rec.ID, "side": side, "owner": rec.OwnerURL, "replica": s.advertise, "reason": reason}
	if cause != nil {
		details["error"] = cause.Error()
	}
	err := s.store.InTx(ctx, func(tx *store.Tx) error {
		ended, err := tx.EndLiveSession(ctx, rec.ID, reason)
		if err != nil || !ended {
			return err // already ended: recorded by whoever ended it
		}
		a := audit(r, p, "terminal.owner_lost", "allocation", rec.AllocationID, details)
		a.Actor, a.ActorRole, a.TenantID = "gpuaas-controller", "system", rec.TenantID
		return tx.Audit(ctx, a)
	})
	if err != nil {
		s.log.Error("recording a terminal session whose owner is lost", "session", rec.ID, "err", err)
	}
	s.log.Warn("terminal session's owning replica lost", "session", rec.ID, "owner", rec.OwnerURL, "side", side, "err", cause)
}

// attachRelayed is the owner's end of a relay: another replica authenticated and authorized
// the caller (and spent its token); this replica attaches the carried connection to its hub.
func (s *Server) attachRelayed(w http.ResponseWriter, r *http.Request, p Principal) error {
	id, side := r.PathValue("session"), r.PathValue("side")
	if side != "client" && side != "host" {
		return errInvalid("side must be client or host")
	}
	rec, err := s.store.GetSession(r.Context(), id, "")
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("session " + id + " not found")
	}
	if err != nil {
		return err
	}
	if !s.ownsSession(rec) || !s.term.Open(id) {
		return apiErr(apiv1.CodeConflict, "the session is no longer waiting (its controller replica restarted or it timed out); open a new one", nil)
	}
	conn, rw, err := s.upgrade(w, r)
	if err != nil {
		return err
	}
	c := terminal.BufferedConn{Conn: conn, R: rw.Reader}
	s.log.Info("terminal "+side+" attached through another replica", "session", id, "allocation", rec.AllocationID, "relay", p.Name)
	if side == "client" {
		err = s.term.AttachClient(id, c)
	} else {
		err = s.term.AttachHost(id, c)
	}
	if err != nil {
		conn.Close()
	}
	return nil
}

// errOwnerUnreachable: the owning replica did not answer at all.
var errOwnerUnreachable = errors.New("owning controller replica unreachable")

// ownerRecording fetches a session's recording from the replica that wrote it.
func (s *Server) ownerRecording(ctx context.Context, rec store.TerminalSessionRecord) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(rec.OwnerURL, "/")+replicaRecordingPath+rec.ID, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Request-Id", requestID(ctx))
	tr := &http.Transport{TLSClientConfig: s.replicaTLS.Clone()}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errOwnerUnreachable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errOwnerUnreachable, err)
	}
	if resp.StatusCode != http.StatusOK {
		var ae apiv1.Error
		if json.Unmarshal(b, &ae) == nil && ae.Code != "" {
			return nil, &ae
		}
		return nil, fmt.Errorf("%w: answered %s", errOwnerUnreachable, resp.Status)
	}
	return b, nil
}

// recordingForReplica serves a recording this replica wrote to another replica (which checked
// the caller's access to the session).
func (s *Server) recordingForReplica(w http.ResponseWriter, r *http.Request, _ Principal) error {
	rec, err := s.store.GetSession(r.Context(), r.PathValue("session"), "")
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("session " + r.PathValue("session") + " not found")
	}
	if err != nil {
		return err
	}
	if rec.Recording == "" || !s.ownsSession(rec) {
		return errNotFound("session " + rec.ID + " has no recording on this replica")
	}
	b, err := os.ReadFile(rec.Recording)
	if err != nil {
		return errNotFound("recording of session " + rec.ID + " is gone: " + err.Error())
	}
	w.Header().Set("Content-Type", "application/x-asciicast")
	_, err = w.Write(b)
	return err
}

// EndAllSessions ends every session this replica holds, recording each (call at shutdown,
// before the process exits: clients are told why, relays see a clean end, nothing is left
// open for the next start to clean up).
func (s *Server) EndAllSessions(reason string) {
	if n := s.term.CloseAll(reason, 10*time.Second); n > 0 {
		s.log.Info("terminal sessions ended: shutting down", "sessions", n)
	}
}

// EndStaleSessions ends the sessions this replica owned before it (re)started: their splices
// lived in its memory. Call before serving.
func (s *Server) EndStaleSessions(ctx context.Context) error {
	if s.advertise == "" {
		return nil
	}
	const reason = "controller replica restarted"
	var n int
	err := s.store.InTx(ctx, func(tx *store.Tx) error {
		recs, err := tx.EndOwnedSessions(ctx, s.advertise, reason)
		n = len(recs)
		for _, rec := range recs {
			if err == nil {
				err = tx.Audit(ctx, store.AuditRecord{Actor: "gpuaas-controller", ActorRole: "system", TenantID: rec.TenantID, Action: "terminal.end",
					TargetKind: "allocation", TargetID: rec.AllocationID, Details: map[string]any{"session_id": rec.ID, "mode": rec.Mode, "reason": reason, "owner": s.advertise}})
			}
		}
		return err
	})
	if err == nil && n > 0 {
		s.log.Warn("ended terminal sessions held by this replica before it restarted", "sessions", n)
	}
	return err
}
