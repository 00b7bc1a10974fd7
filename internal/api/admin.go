package api

import (
	"net/http"
	"regexp"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func (s *Server) whoami(w http.ResponseWriter, r *http.Request, p Principal) error {
	writeJSON(w, http.StatusOK, apiv1.Whoami{TokenID: p.TokenID, Name: p.Name, Role: p.Role, TenantID: p.TenantID, ServerVersion: s.version})
	return nil
}

func (s *Server) createTenant(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req struct {
		Name string `json:"name"`
	}
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if !nameRE.MatchString(req.Name) {
		return errInvalid("tenant name must match %s", nameRE)
	}
	var out apiv1.Tenant
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.CreateTenant(r.Context(), req.Name); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "tenant.create", "tenant", out.ID, map[string]any{"name": out.Name}))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request, _ Principal) error {
	items, err := s.store.ListTenants(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Tenant]{Items: items})
	return nil
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.TokenCreate
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Name == "" || len(req.Name) > 128 {
		return errInvalid("name is required (at most 128 characters)")
	}
	switch req.Role {
	case "admin":
		if req.TenantID != "" {
			return errInvalid("admin tokens do not belong to a tenant")
		}
	case "tenant":
		if req.TenantID == "" {
			return errInvalid("tenant tokens need tenant_id")
		}
	default:
		return errInvalid("role must be admin or tenant")
	}
	var expires *time.Time
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 {
			return errInvalid("ttl must be a positive Go duration such as 720h")
		}
		t := time.Now().Add(d).UTC()
		expires = &t
	}
	tok, err := pki.NewToken("gpa")
	if err != nil {
		return err
	}
	out := apiv1.Token{Name: req.Name, Role: req.Role, TenantID: req.TenantID, Token: tok, ExpiresAt: expires}
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out.ID, err = tx.CreateToken(r.Context(), req.Name, pki.HashToken(tok), req.Role, req.TenantID, expires); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "token.create", "api_token", out.ID,
			map[string]any{"name": req.Name, "role": req.Role, "tenant_id": req.TenantID}))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request, _ Principal) error {
	f := store.AuditFilter{Action: r.URL.Query().Get("action"), TargetID: r.URL.Query().Get("target_id")}
	n, _, err := queryInt(r, "limit", 1, 1000)
	if err != nil {
		return err
	}
	f.Limit = n
	items, err := s.store.ListAudit(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.AuditEntry]{Items: items})
	return nil
}
