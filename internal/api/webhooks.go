package api

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/webhook"
)

func newWebhookSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "whsec_" + hex.EncodeToString(b[:])
}

// createWebhook is POST /api/v1/webhooks: a tenant registers an endpoint for its own events
// (an admin names the tenant). The secret is in this answer only.
func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request, p Principal) error {
	var in apiv1.WebhookCreate
	if err := decode(w, r, &in); err != nil {
		return err
	}
	tenant := p.TenantID
	if p.IsAdmin() {
		if in.TenantID == "" {
			return errInvalid("tenant_id is required: an admin registers a webhook for a tenant")
		}
		tenant = in.TenantID
	} else if in.TenantID != "" && in.TenantID != p.TenantID {
		return errForbidden("a tenant registers webhooks for itself only (leave tenant_id out)")
	}
	if !store.IsUUID(tenant) {
		return errInvalid("tenant_id must be a tenant's id")
	}
	if err := webhook.CheckURL(in.URL, s.webhookAllowPrivate); err != nil {
		return errInvalid("%s", err.Error())
	}
	secret := newWebhookSecret()
	var out apiv1.Webhook
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.CreateWebhook(r.Context(), tenant, in.URL, secret); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "webhook.create", "webhook", out.ID, map[string]any{"url": in.URL, "tenant_id": tenant}))
	})
	if errors.Is(err, store.ErrWebhookLimit) {
		return apiErr(apiv1.CodeConflict, fmt.Sprintf("a tenant has at most %d webhooks; delete one first", store.MaxWebhooksPerTenant),
			map[string]any{"limit": store.MaxWebhooksPerTenant})
	}
	if err != nil {
		return err
	}
	out.Secret = secret
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request, p Principal) error {
	items, err := s.store.ListWebhooks(r.Context(), scopeTenant(p))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Webhook]{Items: items})
	return nil
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request, p Principal) error {
	var out apiv1.Webhook
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.DeleteWebhook(r.Context(), r.PathValue("id"), scopeTenant(p)); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "webhook.delete", "webhook", out.ID, map[string]any{"url": out.URL, "tenant_id": out.TenantID}))
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("webhook " + r.PathValue("id") + " not found")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

var webhookDeliveryStatuses = []string{"pending", "delivered", "dead"}

// webhookDeliveries is GET /api/v1/webhooks/{id}/deliveries: every attempt of the newest
// deliveries, dead letters included (?status=dead).
func (s *Server) webhookDeliveries(w http.ResponseWriter, r *http.Request, p Principal) error {
	status := r.URL.Query().Get("status")
	if status != "" && !slices.Contains(webhookDeliveryStatuses, status) {
		return errInvalid("status must be pending, delivered or dead")
	}
	limit, _, err := queryInt(r, "limit", 1, 500)
	if err != nil {
		return err
	}
	hook, err := s.store.GetWebhook(r.Context(), r.PathValue("id"), scopeTenant(p))
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("webhook " + r.PathValue("id") + " not found")
	}
	if err != nil {
		return err
	}
	items, err := s.store.WebhookDeliveries(r.Context(), hook.ID, status, limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.WebhookDelivery]{Items: items})
	return nil
}

// scopeTenant is the tenant a query is limited to: the caller's, or none for admins.
func scopeTenant(p Principal) string {
	if p.IsAdmin() {
		return ""
	}
	return p.TenantID
}
