package api

import (
	"errors"
	"net/http"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// A slice SKU's demand mix: what placement's look-ahead protects and where it came from
// (learned, pinned or the default), and an admin's pin (internal/demand).

func (s *Server) getDemandMix(w http.ResponseWriter, r *http.Request, _ Principal) error {
	name := r.PathValue("sku")
	sku, err := s.store.GetSKU(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(apiv1.CodeNotFound, "unknown SKU "+name, nil)
	}
	if err != nil {
		return err
	}
	m := s.alloc.DemandMix(sku, r.URL.Query().Get("region"))
	if m == nil {
		return errInvalid("%s is not a slice SKU: only slice placement protects a demand mix", name)
	}
	writeJSON(w, http.StatusOK, m)
	return nil
}

func (s *Server) pinDemandMix(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.DemandMixPin
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if len(req.Entries) == 0 {
		return errInvalid("entries is required (DELETE unpins)")
	}
	m, err := s.alloc.PinDemandMix(r.Context(), actorOf(r, p), r.PathValue("sku"), req.Entries)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, m)
	return nil
}

func (s *Server) unpinDemandMix(w http.ResponseWriter, r *http.Request, p Principal) error {
	m, err := s.alloc.PinDemandMix(r.Context(), actorOf(r, p), r.PathValue("sku"), nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, m)
	return nil
}
