package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/health"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// maxHealthSignals bounds one report from a host.
const maxHealthSignals = 256

func (s *Server) fleetHealth(w http.ResponseWriter, r *http.Request, _ Principal) error {
	items, err := s.store.FleetHealth(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.NodeHealth]{Items: items})
	return nil
}

func (s *Server) healthPolicy(w http.ResponseWriter, r *http.Request, _ Principal) error {
	var items []apiv1.HealthRule
	for _, rule := range health.Table() {
		items = append(items, apiv1.HealthRule{Signal: rule.Signal, Name: rule.Name, Action: string(rule.Action), Source: rule.Source})
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.HealthRule]{Items: items})
	return nil
}

func (s *Server) slotHealth(w http.ResponseWriter, r *http.Request, _ Principal) error {
	idx, err := pathSlotIndex(r)
	if err != nil {
		return err
	}
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	out, err := s.store.SlotHealth(r.Context(), id, idx, 50)
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound(fmt.Sprintf("slot %d not found on node %s", idx, r.PathValue("id")))
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// setSlotHealth is POST .../quarantine (quarantine true) and .../clear: audited, with a reason.
func (s *Server) setSlotHealth(quarantine bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p Principal) error {
		idx, err := pathSlotIndex(r)
		if err != nil {
			return err
		}
		var req apiv1.SlotHealthChange
		if err := decode(w, r, &req); err != nil {
			return err
		}
		id, err := s.nodeID(r)
		if err != nil {
			return err
		}
		out, err := s.alloc.SetSlotHealth(r.Context(), actorOf(r, p), id, idx, quarantine, req.Reason)
		if errors.Is(err, store.ErrNotFound) {
			return errNotFound(fmt.Sprintf("slot %d not found on node %s", idx, r.PathValue("id")))
		}
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
}

// agentHealth records a host's health readings through the policy table. Each reading stands
// alone: one naming an unknown slot or signal is refused and listed, the others are recorded.
func (s *Server) agentHealth(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.HealthReport
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if len(req.Signals) > maxHealthSignals {
		return errInvalid("a health report holds at most %d signals", maxHealthSignals)
	}
	recorded, errs := s.alloc.RecordSignals(r.Context(), p.NodeID, req.Signals)
	out := apiv1.HealthReportResult{Recorded: len(recorded)}
	for _, e := range errs {
		var dbe *store.DBError
		if errors.As(e, &dbe) || errors.Is(e, store.ErrNotFound) {
			out.Refused = append(out.Refused, "a reading names a slot or value the node does not have")
			continue
		}
		out.Refused = append(out.Refused, e.Error())
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// releaseBody reads the optional body of a release: none, or {"report": "..."}.
func releaseBody(w http.ResponseWriter, r *http.Request) (apiv1.ReleaseRequest, error) {
	var req apiv1.ReleaseRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return req, errInvalid("reading the request body: %v", err)
	}
	if len(body) == 0 {
		return req, nil
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return req, errInvalid("Content-Type must be application/json")
	}
	return req, decodeBody(body, &req)
}

// quarantinedSlots is the gpuaas_slots_quarantined gauge by slice SKU, read from the database
// at each scrape (the database is the only truth, so every replica reports the same numbers).
// It has no node label: /metrics is public, and host names are not (`gpuaasctl health` and
// GET /admin/health give the per-node numbers). A SKU without quarantined slots has no series.
type quarantinedSlots struct {
	st   *store.Store
	desc *prometheus.Desc
}

func newQuarantinedSlots(st *store.Store) *quarantinedSlots {
	return &quarantinedSlots{st: st, desc: prometheus.NewDesc("gpuaas_slots_quarantined",
		"Slots quarantined (never placed until an operator clears them after a passed validation), by slice SKU.",
		[]string{"sku"}, nil)}
}

func (q *quarantinedSlots) Describe(ch chan<- *prometheus.Desc) { ch <- q.desc }

func (q *quarantinedSlots) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := q.st.QuarantinedSlots(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(q.desc, err)
		return
	}
	bySKU := map[string]int{}
	for k, n := range counts {
		bySKU[k[1]] += n
	}
	for sku, n := range bySKU {
		ch <- prometheus.MustNewConstMetric(q.desc, prometheus.GaugeValue, float64(n), sku)
	}
}

// validateSlot queues a signed slot.validate on the slot's host at its SKU's level (quick, or
// burn-in where the SKU asks for it: docs/health.md); its result is recorded on the slot, and
// a passed one is what a clear of a quarantine needs. A slot a live allocation holds is
// refused: the reset would hit the tenant's VM (hostd refuses it too).
func (s *Server) validateSlot(w http.ResponseWriter, r *http.Request, p Principal) error {
	idx, err := pathSlotIndex(r)
	if err != nil {
		return err
	}
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	slots, err := s.store.ListSlots(r.Context(), id)
	if err != nil {
		return err
	}
	var slot *apiv1.Slot
	for i := range slots {
		if slots[i].SlotIndex == idx {
			slot = &slots[i]
		}
	}
	if slot == nil {
		return errNotFound(fmt.Sprintf("no slot %d on this node", idx))
	}
	if slot.AllocationID != "" {
		return apiErr(apiv1.CodeConflict, fmt.Sprintf("slot %d is held by a live allocation; validate it after release", idx), nil)
	}
	if s.dispatch == nil {
		return apiErr(apiv1.CodeUnavailable, "task dispatch is not configured", nil)
	}
	payload, err := s.dispatch.ValidationPayload(r.Context(), slot)
	if err != nil {
		return apiErr(apiv1.CodeConflict, fmt.Sprintf("slot %d cannot be validated: %v", idx, err), nil)
	}
	taskID, err := s.dispatch.QueueTask(r.Context(), id, task.TypeSlotValidate, payload, dispatch.ValidationTTL(payload),
		audit(r, p, "slot.validate_requested", "slot", slot.ID, map[string]any{"node_id": id, "slot_index": idx, "level": payload.Level}))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"task_id": taskID})
	return nil
}
