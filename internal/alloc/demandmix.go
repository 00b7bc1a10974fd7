package alloc

import (
	"context"
	"errors"
	"slices"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/demand"
	"github.com/gpuaas/gpuaas/internal/sched"
	"github.com/gpuaas/gpuaas/internal/store"
)

// The demand mix placement's look-ahead protects (internal/demand): pinned, learned from the
// requests this controller's replicas have seen, or the default. Creates count their request
// in the learner's memory, never in their transaction.

// SetDemand installs the demand learner (before the service is used); nil: placement protects
// sched.DefaultMix and counts nothing.
func (s *Service) SetDemand(l *demand.Learner) { s.demand = l }

// Demand is the installed learner (nil: none).
func (s *Service) Demand() *demand.Learner { return s.demand }

// mixFor is the demand mix r's ranking protects: the learner's for r's SKU and region, each
// size under the SKU's topology policy; nil (the default) when there is none, or when none
// of its sizes is one the SKU still sells.
func (s *Service) mixFor(r request) []sched.MixEntry {
	m := s.demand.Mix(r.sku.SKU, r.region)
	var out []sched.MixEntry
	for _, e := range m.Entries {
		if slices.Contains(r.sku.AllowedGPUCounts, e.GPUs) {
			out = append(out, sched.MixEntry{GPUs: e.GPUs, Policy: policyFor(r.sku, e.GPUs), Weight: e.Weight})
		}
	}
	return out
}

// sliceRequest is r as the ranking takes it.
func (s *Service) sliceRequest(r request) sched.Request {
	return sched.Request{GPUs: r.gpus, Policy: r.policy, Mix: r.mix}
}

// countDemand records a create's request in the learner when it asked the fleet for a slice
// SKU's valid size and was created or refused for want of placeable capacity (err nil or
// sku_unavailable): those are the demand. Replays, invalid requests and creates inside a
// capacity reservation (its GPUs were asked for when it was made) are not.
func (s *Service) countDemand(r *request, replayed bool, err error) {
	if r == nil || replayed || r.reservation != "" || r.sku.CapacityShape == "baremetal" {
		return
	}
	var ae *apiv1.Error
	if err != nil && (!errors.As(err, &ae) || ae.Code != apiv1.CodeSKUUnavailable) {
		return
	}
	s.demand.Record(r.sku.SKU, r.region, r.gpus)
}

// DemandMix is the mix in use for a SKU in region, in the API's terms.
func (s *Service) DemandMix(sku apiv1.SKU, region string) *apiv1.DemandMix {
	if sku.CapacityShape == "baremetal" {
		return nil
	}
	m := s.demand.Mix(sku.SKU, region)
	entries := m.Entries
	minRequests := 0.0
	if m.Source == demand.SourceDefault {
		entries, minRequests = sched.DefaultMix(), demand.MinRequests
	}
	total := 0
	for _, e := range entries {
		total += e.Weight
	}
	out := &apiv1.DemandMix{Source: m.Source, Requests: m.Requests, MinRequests: minRequests, Scope: m.Scope, PinnedBy: m.PinnedBy, Entries: []apiv1.DemandMixEntry{}}
	if !m.PinnedAt.IsZero() {
		t := m.PinnedAt
		out.PinnedAt = &t
	}
	for _, e := range entries {
		out.Entries = append(out.Entries, apiv1.DemandMixEntry{GPUs: e.GPUs, Weight: e.Weight, Share: float64(e.Weight) / float64(total)})
	}
	return out
}

// PinDemandMix pins (entries) or unpins (none) a slice SKU's demand mix, audited, and reads
// the pins back so this replica places with it at once (the others within
// demand.RefreshEvery).
func (s *Service) PinDemandMix(ctx context.Context, actor Actor, skuName string, entries []apiv1.DemandMixEntry) (*apiv1.DemandMix, error) {
	if !actor.isAdmin() {
		return nil, &apiv1.Error{Code: apiv1.CodeForbidden, Message: "pinning a demand mix is admin-only"}
	}
	if s.demand == nil {
		return nil, &apiv1.Error{Code: apiv1.CodeConflict, Message: "this controller runs without a demand learner"}
	}
	sku, err := s.st.GetSKU(ctx, skuName)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &apiv1.Error{Code: apiv1.CodeNotFound, Message: "unknown SKU " + skuName}
	}
	if err != nil {
		return nil, err
	}
	if sku.CapacityShape != "gpu_slice" {
		return nil, invalid("%s is not a slice SKU: only slice placement protects a demand mix", skuName)
	}
	weights := map[int]int{}
	for i, e := range entries {
		switch {
		case !slices.Contains(sku.AllowedGPUCounts, e.GPUs):
			return nil, invalid("entry %d: %s sells %v GPUs, not %d", i, skuName, sku.AllowedGPUCounts, e.GPUs)
		case e.Weight < 1 || e.Weight > 1<<20:
			return nil, invalid("entry %d: weight must be 1 to %d, got %d", i, 1<<20, e.Weight)
		case weights[e.GPUs] != 0:
			return nil, invalid("entry %d: %d GPUs named twice", i, e.GPUs)
		}
		weights[e.GPUs] = e.Weight
	}
	action := "sku.demand_mix.pin"
	if len(weights) == 0 {
		action = "sku.demand_mix.unpin"
	}
	rec := actor.audit(action, "sku", skuName, map[string]any{"entries": entries})
	if err := s.st.PinDemandMix(ctx, skuName, weights, actor.Name, rec); err != nil {
		return nil, err
	}
	if err := s.demand.Refresh(ctx); err != nil {
		return nil, err
	}
	return s.DemandMix(sku, ""), nil
}
