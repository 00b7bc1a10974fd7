package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// maxMaintenanceNotice bounds how far ahead a maintenance deadline may be announced.
const maxMaintenanceNotice = 90 * 24 * time.Hour

// maintenanceRequest reads drain's optional body: none, or a notice with a reason. It returns
// a zero deadline when there is no notice to send.
func maintenanceRequest(w http.ResponseWriter, r *http.Request, now time.Time) (reason string, deadline time.Time, err error) {
	if r.ContentLength == 0 {
		return "", time.Time{}, nil
	}
	var in apiv1.MaintenanceRequest
	if err := decode(w, r, &in); err != nil {
		return "", time.Time{}, err
	}
	in.Reason = strings.TrimSpace(in.Reason)
	if in.Notice == "" && in.Reason == "" {
		return "", time.Time{}, nil
	}
	if in.Notice == "" || in.Reason == "" {
		return "", time.Time{}, errInvalid("a maintenance notice needs both notice (how long from now, e.g. 24h) and reason")
	}
	d, perr := time.ParseDuration(in.Notice)
	if perr != nil || d < 0 || d > maxMaintenanceNotice {
		return "", time.Time{}, errInvalid("notice must be a duration from 0s to %s (e.g. 24h)", maxMaintenanceNotice)
	}
	if len(in.Reason) > 1000 || !plainText(in.Reason) {
		return "", time.Time{}, errInvalid("reason must be at most 1000 characters of plain text")
	}
	return in.Reason, now.Add(d).Truncate(time.Second), nil
}

// listMaintenance is GET /api/v1/maintenance.
func (s *Server) listMaintenance(w http.ResponseWriter, r *http.Request, p Principal) error {
	tenant := ""
	if !p.IsAdmin() {
		tenant = p.TenantID
	}
	items, err := s.store.ListMaintenance(r.Context(), tenant)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.MaintenanceNotice]{Items: items})
	return nil
}
