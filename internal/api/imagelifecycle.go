package api

import (
	"errors"
	"net/http"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// The image lifecycle: smoke tests, activation, and each SKU's default image pointer with
// its canary rollouts (docs/images.md).

// startSmokeTest serves POST /api/v1/admin/os-images/{id}/smoke-tests.
func (s *Server) startSmokeTest(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.ImageSmokeTestCreate
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if strings.TrimSpace(req.Node) == "" {
		return errInvalid("node is required: the node whose free slot boots the image")
	}
	out, err := s.alloc.StartSmokeTest(r.Context(), actorOf(r, p), r.PathValue("id"), req.Node)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// listSmokeTests serves GET /api/v1/admin/os-images/{id}/smoke-tests.
func (s *Server) listSmokeTests(w http.ResponseWriter, r *http.Request, _ Principal) error {
	id := r.PathValue("id")
	out, err := s.store.SmokeTests(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("image " + id + " not found")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.ImageSmokeTest]{Items: out})
	return nil
}

// activateImage serves POST /api/v1/admin/os-images/{id}/activate: only a passed smoke test
// of the image's current digest lets it become active.
func (s *Server) activateImage(w http.ResponseWriter, r *http.Request, p Principal) error {
	id := r.PathValue("id")
	var out apiv1.OSImage
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.ActivateImage(r.Context(), id); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "os_image.activate", "os_image", out.ID, map[string]any{
			"slug": out.Slug, "digest_sha256": out.DigestSHA256}))
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return errNotFound("image " + id + " not found")
	case errors.Is(err, store.ErrNoPassedSmokeTest):
		return apiErr(apiv1.CodeConflict, "image "+id+" has no passed smoke test of its digest: run gpuaasctl images test "+id+" --node NODE first", nil)
	case err != nil:
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// rolloutStatus serves GET /api/v1/admin/skus/{sku}/image-rollout.
func (s *Server) rolloutStatus(w http.ResponseWriter, r *http.Request, _ Principal) error {
	sku := r.PathValue("sku")
	out, err := s.store.ImageRolloutStatus(r.Context(), sku)
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("SKU " + sku + " not found")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// setDefaultImage serves PUT /api/v1/admin/skus/{sku}/default-image.
func (s *Server) setDefaultImage(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.DefaultImageSet
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Image == "" {
		return errInvalid("image is required")
	}
	sku := r.PathValue("sku")
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		if err := tx.SetDefaultImage(r.Context(), sku, req.Image); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "sku.default_image", "sku", sku, map[string]any{"image": req.Image}))
	})
	if err != nil {
		return rolloutErr(err, sku, req.Image)
	}
	return s.rolloutStatus(w, r, p)
}

// startRollout serves POST /api/v1/admin/skus/{sku}/image-rollout.
func (s *Server) startRollout(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.ImageRolloutCreate
	if err := decode(w, r, &req); err != nil {
		return err
	}
	switch {
	case req.Image == "":
		return errInvalid("image is required")
	case req.SharePercent < 0 || req.SharePercent > 100:
		return errInvalid("share_percent must be 0..100")
	case req.SharePercent == 0 && len(req.Regions) == 0:
		return errInvalid("a canary needs a share_percent above 0 or at least one region")
	case len(req.Regions) > 64:
		return errInvalid("at most 64 regions")
	}
	for _, rg := range req.Regions {
		if strings.TrimSpace(rg) == "" || len(rg) > 64 {
			return errInvalid("region names are 1..64 characters")
		}
	}
	sku := r.PathValue("sku")
	var out apiv1.ImageRollout
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.StartRollout(r.Context(), sku, req); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "sku.image_rollout.start", "sku", sku, map[string]any{
			"rollout_id": out.ID, "image": out.Image, "previous_image": out.PreviousImage, "share_percent": out.SharePercent, "regions": out.Regions}))
	})
	if err != nil {
		return rolloutErr(err, sku, req.Image)
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// finishRollout serves POST /api/v1/admin/skus/{sku}/image-rollout/promote and .../rollback.
func (s *Server) finishRollout(promote bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p Principal) error {
		sku := r.PathValue("sku")
		var out apiv1.ImageRollout
		err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
			var err error
			action := "sku.image_rollout.rollback"
			if promote {
				action = "sku.image_rollout.promote"
				out, err = tx.PromoteRollout(r.Context(), sku)
			} else {
				out, err = tx.RollBack(r.Context(), sku)
			}
			if err != nil {
				return err
			}
			return tx.Audit(r.Context(), audit(r, p, action, "sku", sku, map[string]any{
				"rollout_id": out.ID, "image": out.Image, "previous_image": out.PreviousImage}))
		})
		if err != nil {
			return rolloutErr(err, sku, "")
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
}

// rolloutErr names what was not found; other errors (a refused pointer, a canary already
// running) carry the database's words.
func rolloutErr(err error, sku, image string) error {
	if errors.Is(err, store.ErrNotFound) {
		if image != "" {
			return errNotFound("SKU " + sku + " or image " + image + " not found")
		}
		return errNotFound("SKU " + sku + " not found")
	}
	return err
}
