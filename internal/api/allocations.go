package api

import (
	"net/http"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func actorOf(r *http.Request, p Principal) alloc.Actor {
	return alloc.Actor{TokenID: p.TokenID, Name: p.Name, Role: p.Role, TenantID: p.TenantID, RequestID: requestID(r.Context())}
}

func (s *Server) createAllocation(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.AllocationCreate
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if len(req.Region) > 64 || len(req.SKU) > 64 || len(req.Image) > 96 || len(req.Profile) > 96 {
		return errInvalid("sku, region, image and profile are limited to 64-96 characters")
	}
	out, replayed, err := s.alloc.Create(r.Context(), actorOf(r, p), req, r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if replayed {
		status = http.StatusOK
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if !replayed && len(out.Tasks) == 0 {
		s.kick() // its host task comes from the outbox (a slice's was queued with it)
	}
	w.Header().Set("Location", "/api/v1/allocations/"+out.ID)
	writeJSON(w, status, out)
	return nil
}

func (s *Server) listAllocations(w http.ResponseWriter, r *http.Request, p Principal) error {
	items, err := s.alloc.List(r.Context(), actorOf(r, p), r.URL.Query().Get("status"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Allocation]{Items: items})
	return nil
}

func (s *Server) getAllocation(w http.ResponseWriter, r *http.Request, p Principal) error {
	out, err := s.alloc.Get(r.Context(), actorOf(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) releaseAllocation(w http.ResponseWriter, r *http.Request, p Principal) error {
	req, err := releaseBody(w, r)
	if err != nil {
		return err
	}
	var out apiv1.Allocation
	if req.Report != "" {
		out, err = s.alloc.ReleaseWithReport(r.Context(), actorOf(r, p), r.PathValue("id"), req.Report)
	} else {
		out, err = s.alloc.Release(r.Context(), actorOf(r, p), r.PathValue("id"))
	}
	if err != nil {
		return err
	}
	// Released at once: the allocation never reached its host, so it was never active and no
	// terminal session can exist for it (they open only while active): nothing to end here or
	// on another replica, and no NOTIFY round trip on the request path.
	if out.Status != "released" {
		s.endSessions(r.Context(), "release", out.ID, "")
		s.kick() // the host tears down and wipes
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) explainPlacement(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.PlacementRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	out, err := s.alloc.Explain(r.Context(), actorOf(r, p), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) capacity(w http.ResponseWriter, r *http.Request, p Principal) error {
	items, err := s.alloc.Capacity(r.Context(), actorOf(r, p), r.URL.Query().Get("sku"), r.URL.Query().Get("region"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Capacity]{Items: items})
	return nil
}

// kick wakes the dispatcher's outbox worker after an allocation change committed.
func (s *Server) kick() {
	if s.dispatch != nil {
		s.dispatch.Kick()
	}
}
