package api

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// TerminalConfig tunes the SSH relay.
type TerminalConfig struct {
	TicketTTL    time.Duration // how long both ends have to attach (default 60 s)
	Idle         time.Duration // idle timeout of a running session (default 30 m)
	MaxPerTenant int           // concurrent sessions per tenant (default 8)
	RecordDir    string        // asciicast recordings of terminal-mode output ("" = off)
}

func (c *TerminalConfig) defaults() {
	if c.TicketTTL <= 0 {
		c.TicketTTL = 60 * time.Second
	}
	if c.MaxPerTenant <= 0 {
		c.MaxPerTenant = 8
	}
}

func newToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "gts_" + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// openTerminal authorizes a session into an allocation's VM, records it, and queues the signed
// terminal.open task for the allocation's host. Only the allocation's tenant (or an admin,
// audited as such) while it is active; console mode is admin-only.
func (s *Server) openTerminal(w http.ResponseWriter, r *http.Request, p Principal) error {
	if s.dispatch == nil || s.term == nil {
		return apiErr(apiv1.CodeUnavailable, "the terminal relay is not configured", nil)
	}
	var req apiv1.TerminalRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	switch req.Mode {
	case terminal.ModeTerminal, terminal.ModeStdio:
	case terminal.ModeConsole:
		if !p.IsAdmin() {
			return errForbidden("the serial console is for admins")
		}
	default:
		return errInvalid("mode must be terminal, stdio or console")
	}
	if req.Cols < 0 || req.Rows < 0 || req.Cols > 1000 || req.Rows > 1000 || len(req.Command) > 4096 {
		return errInvalid("cols/rows must be 0..1000 and command at most 4096 bytes")
	}
	if req.Mode != terminal.ModeTerminal && req.Command != "" {
		return errInvalid("a command runs only in terminal mode")
	}
	id := r.PathValue("id")
	tenant := ""
	if !p.IsAdmin() {
		tenant = p.TenantID
	}
	rec, err := s.store.GetAllocation(r.Context(), id, tenant)
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("allocation " + id + " not found")
	}
	if err != nil {
		return err
	}
	if rec.Status != "active" {
		return apiErr(apiv1.CodeConflict, fmt.Sprintf("allocation %s is %s; terminals open only while it is active", id, rec.Status), nil)
	}
	if rec.CapacityShape != "gpu_slice" {
		return apiErr(apiv1.CodeConflict, "terminals are for slice VMs; a baremetal node is reached directly", nil)
	}
	var img struct {
		Username string `json:"default_username"`
	}
	_ = json.Unmarshal(rec.ImageSnapshot, &img)
	guestIP := ""
	for _, c := range rec.Claims {
		if c.Kind == "slot" && c.NodeID == rec.NodeID && c.PrivateIP != "" && guestIP == "" {
			guestIP = c.PrivateIP // the boot slot's address (claims are ordered by slot)
		}
	}
	if guestIP == "" || img.Username == "" {
		return apiErr(apiv1.CodeConflict, "the allocation has no guest address or login user", nil)
	}
	clientTok, err := newToken()
	if err != nil {
		return err
	}
	hostTok, err := newToken()
	if err != nil {
		return err
	}
	expires := time.Now().Add(s.termCfg.TicketTTL).UTC()
	var sessionID string
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		n, err := tx.CountLiveSessions(r.Context(), rec.TenantID)
		if err != nil {
			return err
		}
		if n >= s.termCfg.MaxPerTenant {
			return apiErr(apiv1.CodeConflict, fmt.Sprintf("the tenant already has %d open sessions (limit %d)", n, s.termCfg.MaxPerTenant), nil)
		}
		sessionID, err = tx.InsertTerminalSession(r.Context(), store.NewTerminalSession{AllocationID: rec.ID, TenantID: rec.TenantID,
			NodeID: rec.NodeID, Actor: p.Name + " (" + p.TokenID + ")", ActorRole: p.Role, TokenID: p.TokenID, Mode: req.Mode,
			Command: req.Command, ClientTokenHash: pki.HashToken(clientTok), HostTokenHash: pki.HashToken(hostTok), ExpiresAt: expires, OwnerURL: s.advertise})
		if err != nil {
			return err
		}
		details := map[string]any{"session_id": sessionID, "mode": req.Mode, "command": req.Command}
		if p.IsAdmin() {
			details["as_admin"] = true // an operator entering a tenant's VM
		}
		return tx.Audit(r.Context(), audit(r, p, "terminal.open", "allocation", rec.ID, details))
	})
	if err != nil {
		return err
	}
	s.term.Expect(sessionID, rec.ID, req.Mode, req.Cols, req.Rows, s.termCfg.TicketTTL+10*time.Second)
	taskID, err := s.dispatch.QueueTask(r.Context(), rec.NodeID, task.TypeTerminalOpen, task.TerminalOpen{SessionID: sessionID,
		AllocationID: rec.ID, Mode: req.Mode, HostToken: hostTok, AttachPath: "/api/v1/agent/terminal/" + sessionID,
		GuestIP: guestIP, Username: img.Username, Command: req.Command, Cols: req.Cols, Rows: req.Rows}, s.termCfg.TicketTTL+s.termCfg.Idle+24*time.Hour)
	if err != nil {
		return err
	}
	_ = s.store.InTx(r.Context(), func(tx *store.Tx) error { return tx.SetSessionTask(r.Context(), sessionID, taskID) })
	writeJSON(w, http.StatusCreated, apiv1.TerminalTicket{SessionID: sessionID, Token: clientTok,
		AttachPath: "/api/v1/terminal/" + sessionID + "/attach", ExpiresAt: expires, Simulated: rec.Simulated})
	return nil
}

// upgrade answers 101 Switching Protocols and returns the raw connection. The request must
// ask for the relay's protocol over HTTP/1.1.
func (s *Server) upgrade(w http.ResponseWriter, r *http.Request) (net.Conn, *bufio.ReadWriter, error) {
	if r.Header.Get("Upgrade") != terminal.UpgradeProtocol {
		return nil, nil, errInvalid("this endpoint upgrades the connection: send Connection: Upgrade and Upgrade: %s over HTTP/1.1", terminal.UpgradeProtocol)
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil, apiErr(apiv1.CodeInvalidRequest, "cannot take over this connection (HTTP/2?): use HTTP/1.1", nil)
	}
	_ = conn.SetDeadline(time.Time{}) // the server's read timeout must not cut a session
	_, err = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + terminal.UpgradeProtocol + "\r\n\r\n")
	if err == nil {
		err = rw.Flush()
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, rw, nil
}

// attachClient is gpuaasctl's end: the user's bearer token (the one that opened the session)
// plus the single-use session token.
func (s *Server) attachClient(w http.ResponseWriter, r *http.Request, p Principal) error {
	if s.term == nil {
		return apiErr(apiv1.CodeUnavailable, "the terminal relay is not configured", nil)
	}
	id := r.PathValue("session")
	rec, err := s.store.UseClientToken(r.Context(), id, pki.HashToken(r.Header.Get(terminal.TokenHeader)), p.TokenID)
	if errors.Is(err, store.ErrNotFound) {
		return errUnauthorized("the session token is invalid, expired or already used")
	}
	if err != nil {
		return err
	}
	if !s.ownsSession(rec) {
		return s.relayEnd(w, r, p, rec, "client")
	}
	if !s.term.Open(id) {
		return apiErr(apiv1.CodeConflict, "the session is no longer waiting (controller restarted or timed out); open a new one", nil)
	}
	conn, rw, err := s.upgrade(w, r)
	if err != nil {
		return err
	}
	s.log.Info("terminal client attached", "session", id, "allocation", rec.AllocationID, "actor", rec.Actor)
	_ = s.term.AttachClient(id, terminal.BufferedConn{Conn: conn, R: rw.Reader})
	return nil
}

// attachHost is hostd's outbound end: its node certificate plus the session's host token.
func (s *Server) attachHost(w http.ResponseWriter, r *http.Request, p Principal) error {
	if s.term == nil {
		return apiErr(apiv1.CodeUnavailable, "the terminal relay is not configured", nil)
	}
	id := r.PathValue("session")
	rec, err := s.store.UseHostToken(r.Context(), id, pki.HashToken(r.Header.Get(terminal.TokenHeader)), p.NodeID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return errUnauthorized("the host token is invalid, expired, used, or not this node's")
		}
		return err
	}
	if !s.ownsSession(rec) {
		_ = s.store.MarkSessionOpen(r.Context(), id, time.Now().UTC())
		return s.relayEnd(w, r, p, rec, "host")
	}
	conn, rw, err := s.upgrade(w, r)
	if err != nil {
		return err
	}
	_ = s.store.MarkSessionOpen(r.Context(), id, time.Now().UTC())
	if err := s.term.AttachHost(id, terminal.BufferedConn{Conn: conn, R: rw.Reader}); err != nil {
		conn.Close()
	}
	return nil
}

// sessionEnded persists and audits a finished session (the hub's OnEnd).
func (s *Server) sessionEnded(st terminal.Stats) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.store.InTx(ctx, func(tx *store.Tx) error {
		if err := tx.EndSession(ctx, st.SessionID, st.Started, st.Ended, st.BytesIn, st.BytesOut, st.ExitStatus, st.Reason, st.Recording); err != nil {
			return err
		}
		return tx.Audit(ctx, store.AuditRecord{Actor: "gpuaas-controller", ActorRole: "system", Action: "terminal.end", TargetKind: "allocation",
			TargetID: st.AllocationID, Details: map[string]any{"session_id": st.SessionID, "mode": st.Mode, "bytes_in": st.BytesIn,
				"bytes_out": st.BytesOut, "exit_status": st.ExitStatus, "reason": st.Reason, "seconds": st.Ended.Sub(st.Started).Seconds()}})
	})
	if err != nil {
		s.log.Error("recording the end of a terminal session", "session", st.SessionID, "err", err)
	}
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request, p Principal) error {
	tenant := ""
	if !p.IsAdmin() {
		tenant = p.TenantID
	}
	recs, err := s.store.ListSessions(r.Context(), tenant, r.URL.Query().Get("allocation"), 200)
	if err != nil {
		return err
	}
	out := make([]apiv1.TerminalSession, 0, len(recs))
	for _, x := range recs {
		out = append(out, x.TerminalSession)
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.TerminalSession]{Items: out})
	return nil
}

func (s *Server) session(r *http.Request, p Principal) (store.TerminalSessionRecord, error) {
	tenant := ""
	if !p.IsAdmin() {
		tenant = p.TenantID
	}
	rec, err := s.store.GetSession(r.Context(), r.PathValue("session"), tenant)
	if errors.Is(err, store.ErrNotFound) {
		return rec, errNotFound("session " + r.PathValue("session") + " not found")
	}
	return rec, err
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, p Principal) error {
	rec, err := s.session(r, p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rec.TerminalSession)
	return nil
}

// getRecording serves a session's asciicast v2 file.
func (s *Server) getRecording(w http.ResponseWriter, r *http.Request, p Principal) error {
	rec, err := s.session(r, p)
	if err != nil {
		return err
	}
	if rec.Recording == "" {
		return errNotFound("session " + rec.ID + " was not recorded (terminal mode with --terminal-record-dir only)")
	}
	var b []byte
	if !s.ownsSession(rec) && s.replicaTLS != nil {
		// The owner wrote it on its disk: ask it; its answer stands unless it is unreachable
		// (then a copy on storage both replicas mount may still serve).
		if b, err = s.ownerRecording(r.Context(), rec); err != nil && !errors.Is(err, errOwnerUnreachable) {
			return err
		}
	}
	if b == nil {
		if b, err = os.ReadFile(rec.Recording); err != nil {
			return errNotFound("recording of session " + rec.ID + " is gone: " + err.Error())
		}
	}
	w.Header().Set("Content-Type", "application/x-asciicast")
	_, err = w.Write(b)
	return err
}
