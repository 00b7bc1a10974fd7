package api

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// Principal is the authenticated caller.
type Principal struct {
	TokenID  string
	Name     string
	Role     string // admin | tenant
	TenantID string
	NodeID   string // role node: the enrolled node
}

// IsAdmin reports whether the caller holds the admin role.
func (p Principal) IsAdmin() bool { return p.Role == "admin" }

func errUnauthorized(msg string) *apiv1.Error { return apiErr(apiv1.CodeUnauthorized, msg, nil) }

func (s *Server) authenticate(r *http.Request) (Principal, error) {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || strings.TrimSpace(tok) == "" {
		return Principal{}, errUnauthorized("missing bearer token")
	}
	hash := pki.HashToken(strings.TrimSpace(tok))
	rec, cached, gen := s.tokens.get(hash)
	if !cached {
		var err error
		rec, err = s.store.LookupToken(r.Context(), hash)
		if errors.Is(err, store.ErrNotFound) {
			return Principal{}, errUnauthorized("invalid token")
		}
		if err != nil {
			return Principal{}, err
		}
		if rec.RevokedAt == nil {
			s.tokens.put(hash, rec, gen)
		}
	}
	if rec.RevokedAt != nil {
		return Principal{}, errUnauthorized("token revoked")
	}
	if rec.ExpiresAt != nil && time.Now().After(*rec.ExpiresAt) {
		return Principal{}, errUnauthorized("token expired")
	}
	if !cached { // last use is recorded when the cache is filled: at most once per tokenCacheTTL
		if err := s.store.TouchToken(r.Context(), rec.ID); err != nil {
			s.log.Warn("token touch failed", "err", err)
		}
	}
	return Principal{TokenID: rec.ID, Name: rec.Name, Role: rec.Role, TenantID: rec.TenantID}, nil
}

// audit builds the audit record of the caller for an action.
func audit(r *http.Request, p Principal, action, kind, id string, details any) store.AuditRecord {
	return store.AuditRecord{
		Actor: p.Name + " (" + p.TokenID + ")", ActorRole: p.Role, TenantID: p.TenantID,
		Action: action, TargetKind: kind, TargetID: id, RequestID: requestID(r.Context()), Details: details,
	}
}
