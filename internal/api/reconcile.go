package api

import (
	"errors"
	"net/http"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

func (s *Server) queueReconcile(w http.ResponseWriter, r *http.Request, p Principal) error {
	if s.dispatch == nil {
		return apiErr(apiv1.CodeUnavailable, "task dispatch is not configured", nil)
	}
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	taskID, err := s.dispatch.QueueReconcile(r.Context(), id, audit(r, p, "node.reconcile", "node", id, map[string]any{}))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, apiv1.Reconcile{NodeID: id, TaskID: taskID, Status: "queued"})
	return nil
}

func (s *Server) getReconcile(w http.ResponseWriter, r *http.Request, _ Principal) error {
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	tr, err := s.store.LatestTask(r.Context(), id, string(task.TypeReconcile))
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("no reconcile for this node yet; POST .../reconcile")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.Reconcile{NodeID: id, TaskID: tr.ID, Status: tr.Status, Error: tr.Error, CompletedAt: tr.CompletedAt, Report: tr.Output})
	return nil
}
