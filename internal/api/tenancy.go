package api

import (
	"net/http"
	"strconv"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// tenantRef resolves a tenant named by id or name (admin routes' {id}).
func (s *Server) tenantRef(r *http.Request, ref string) (string, error) {
	if store.IsUUID(ref) {
		return ref, nil
	}
	tenants, err := s.store.ListTenants(r.Context())
	if err != nil {
		return "", err
	}
	for _, t := range tenants {
		if t.Name == ref {
			return t.ID, nil
		}
	}
	return "", errNotFound("tenant not found")
}

func (s *Server) listQuotas(w http.ResponseWriter, r *http.Request, p Principal) error {
	tenant := r.URL.Query().Get("tenant")
	if tenant != "" && p.Role == "admin" {
		id, err := s.tenantRef(r, tenant)
		if err != nil {
			return err
		}
		tenant = id
	}
	items, err := s.alloc.Quotas(r.Context(), actorOf(r, p), tenant)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Quota]{Items: items})
	return nil
}

func (s *Server) setQuota(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.QuotaSet
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if len(req.SKU) > 64 || len(req.Region) > 64 {
		return errInvalid("sku and region are limited to 64 characters")
	}
	tenant, err := s.tenantRef(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	out, err := s.alloc.SetQuota(r.Context(), actorOf(r, p), tenant, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteQuota(w http.ResponseWriter, r *http.Request, p Principal) error {
	q := r.URL.Query()
	if q.Get("sku") == "" {
		return errInvalid("query parameter sku is required")
	}
	tenant, err := s.tenantRef(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.alloc.DeleteQuota(r.Context(), actorOf(r, p), tenant, q.Get("sku"), q.Get("region")); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"deleted": "quota"})
	return nil
}

func (s *Server) createReservation(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.ReservationCreate
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if len(req.SKU) > 64 || len(req.Region) > 64 {
		return errInvalid("sku and region are limited to 64 characters")
	}
	out, err := s.alloc.CreateReservation(r.Context(), actorOf(r, p), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/v1/reservations/"+out.ID)
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listReservations(w http.ResponseWriter, r *http.Request, p Principal) error {
	q := r.URL.Query()
	active := false
	if v := q.Get("active"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errInvalid("active must be true or false")
		}
		active = b
	}
	tenant := q.Get("tenant")
	if tenant != "" && p.Role == "admin" {
		id, err := s.tenantRef(r, tenant)
		if err != nil {
			return err
		}
		tenant = id
	}
	items, err := s.alloc.ListReservations(r.Context(), actorOf(r, p), tenant, active)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Reservation]{Items: items})
	return nil
}

func (s *Server) getReservation(w http.ResponseWriter, r *http.Request, p Principal) error {
	out, err := s.alloc.GetReservation(r.Context(), actorOf(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) cancelReservation(w http.ResponseWriter, r *http.Request, p Principal) error {
	out, err := s.alloc.CancelReservation(r.Context(), actorOf(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
