package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// RevokeChannel is the PostgreSQL NOTIFY channel on which a replica that revoked a
// credential tells the others to drop it from their authentication caches. Payloads are
// "token:<id>" and "node:<id>".
const RevokeChannel = "gpuaas_auth_revoked"

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request, _ Principal) error {
	items, err := s.store.ListTokens(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Token]{Items: items})
	return nil
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, p Principal) error {
	id := r.PathValue("id")
	var out apiv1.Token
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.RevokeToken(r.Context(), id); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "token.revoke", "api_token", out.ID,
			map[string]any{"name": out.Name, "role": out.Role, "tenant_id": out.TenantID}))
	})
	if err != nil {
		return err
	}
	s.forget(r.Context(), "token:"+out.ID)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) revokeNode(w http.ResponseWriter, r *http.Request, p Principal) error {
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	var out apiv1.NodeRevocation
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.RevokeNodeCredentials(r.Context(), id); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "node.revoke", "node", id,
			map[string]any{"certificates": out.RevokedCertificates, "bootstrap_tokens": out.RevokedBootstrapTokens}))
	})
	if err != nil {
		return err
	}
	s.forget(r.Context(), "node:"+id)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// forget drops a revoked credential from this replica's caches now and asks the other
// replicas to do the same (best effort: a replica that misses the notification trusts its
// cache until the entry's TTL, tokenCacheTTL or nodeCertCacheTTL).
func (s *Server) forget(ctx context.Context, what string) {
	s.dropCached(what)
	if err := s.store.Notify(ctx, RevokeChannel, what); err != nil {
		s.log.Warn("revocation not broadcast to other replicas; they follow within the cache TTL", "what", what, "err", err)
	}
}

func (s *Server) dropCached(what string) {
	kind, id, _ := strings.Cut(what, ":")
	switch kind {
	case "token":
		s.tokens.dropIf(func(t store.TokenRecord) bool { return t.ID == id })
	case "node":
		s.nodeCerts.dropIf(func(nodeID string) bool { return nodeID == id })
	}
}

// listenReplicas applies other replicas' revocations to this replica's caches, their
// session ends to the terminal sessions it holds, and their event notifications to its event
// long polls (one connection for all).
func (s *Server) listenReplicas(ctx context.Context) {
	s.store.ListenEach(ctx, map[string]func(string){RevokeChannel: s.dropCached, TerminalChannel: s.applyEnd,
		store.EventsChannel: func(string) { s.events.wake() }},
		func(err error) {
			s.log.Warn("revocation, terminal and event notifications interrupted; reconnecting", "err", err)
		}, nil)
}
