package alloc

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/sched"
	"github.com/gpuaas/gpuaas/internal/store"
)

// Explain answers a placement dry run: what would be chosen and why, or why nothing fits.
// It reserves nothing. Admins get the ranked choices with their nodes; a tenant gets its own
// answer (forTenant), never a host's identity or another tenant's occupancy.
func (s *Service) Explain(ctx context.Context, actor Actor, req apiv1.PlacementRequest) (apiv1.PlacementExplain, error) {
	switch {
	case req.TenantID != "" && !store.IsUUID(req.TenantID):
		return apiv1.PlacementExplain{}, invalid("tenant_id %q is not a tenant id", req.TenantID)
	case actor.isAdmin() && req.TenantID != "":
		actor.TenantID = req.TenantID // placed as that tenant: its dedicated nodes count
	case !actor.isAdmin() && req.TenantID != "" && req.TenantID != actor.TenantID:
		return apiv1.PlacementExplain{}, &apiv1.Error{Code: apiv1.CodeForbidden, Message: "tenants explain placements only for themselves"}
	}
	out, err := s.explain(ctx, actor, req)
	if err != nil || actor.isAdmin() {
		return out, err
	}
	return forTenant(req, out), nil
}

// forTenant is a tenant's view of an explain answer: whether its request fits now and why
// not, in its own terms. Choices name nodes and rank the fleet, so a tenant gets none of
// them; what the best one means for its VM (one host, how many NUMA nodes) is said in words.
// Refusals carry counts only (the same reason and details a refused create gets).
func forTenant(req apiv1.PlacementRequest, ex apiv1.PlacementExplain) apiv1.PlacementExplain {
	if !ex.Feasible {
		return apiv1.PlacementExplain{Feasible: false, Reason: ex.Reason, Message: ex.Message, Details: ex.Details}
	}
	out := apiv1.PlacementExplain{Feasible: true}
	what := fmt.Sprintf("%d GPUs of %s", req.GPUs, req.SKU)
	if req.SKU == "" {
		what = fmt.Sprintf("%d GPUs", req.GPUs)
	}
	if req.Region != "" {
		what += " in region " + req.Region
	}
	if req.ReservationID != "" {
		what += " in reservation " + req.ReservationID
	}
	best := ex.Choices[0]
	switch n := len(best.NUMANodes); {
	case len(best.SlotIndexes) == 0:
		out.Message = "a whole node for " + what + " is free now"
	case n == 1:
		out.Message = what + " fit now on one host, within one NUMA node"
		out.Details = map[string]any{"numa_nodes": n}
	default:
		out.Message = fmt.Sprintf("%s fit now on one host, across %d NUMA nodes", what, n)
		out.Details = map[string]any{"numa_nodes": n}
	}
	return out
}

func (s *Service) explain(ctx context.Context, actor Actor, req apiv1.PlacementRequest) (apiv1.PlacementExplain, error) {
	var out apiv1.PlacementExplain
	if req.ReservationID != "" {
		return s.explainInReservation(ctx, actor, req)
	}
	r, err := s.resolveRequest(ctx, nil, actor, req.SKU, req.GPUs, req.Region)
	if err != nil {
		return explainError(err)
	}
	if r.sku.CapacityShape == "baremetal" {
		cands, err := s.st.BaremetalCandidates(ctx, s.query(r))
		if err != nil {
			return out, err
		}
		nodes := make([]sched.BaremetalNode, 0, len(cands))
		for _, c := range cands {
			nodes = append(nodes, sched.BaremetalNode{ID: c.NodeID, Name: c.NodeName, ApprovedSlots: c.ApprovedSlots})
		}
		for i, n := range sched.RankBaremetal(nodes) {
			if i == 5 {
				break
			}
			reason := "whole node, no slice slots approved"
			if n.ApprovedSlots > 0 {
				reason = "whole node (slice-capable; ranked after baremetal-only nodes)"
			}
			out.Choices = append(out.Choices, apiv1.PlacementChoice{NodeID: n.ID, NodeName: n.Name, Reason: reason})
		}
		out.Feasible = len(out.Choices) > 0
		if !out.Feasible {
			out.Reason, out.Message = apiv1.ReasonNoCapacity, "no free "+r.sku.SKU+" node"
		} else {
			out.Message = "would take node " + out.Choices[0].NodeName
		}
		return out, nil
	}
	if _, err := s.st.ResolveSliceImage(ctx, r.sku.SKU, ""); errors.Is(err, store.ErrNotFound) {
		return explainError(unavailable(apiv1.ReasonNoImage, "no active vm_slice image with a digest is compatible with "+r.sku.SKU, nil))
	} else if err != nil {
		return out, err
	}
	cands, err := s.st.SliceCandidates(ctx, s.query(r))
	if err != nil {
		return out, err
	}
	topo, err := s.st.NodeTopologies(ctx, nodeIDs(cands))
	if err != nil {
		return out, err
	}
	outcome := sched.PlaceSlice(s.sliceRequest(r), buildNodes(cands, topo))
	if len(outcome.Choices) == 0 {
		return explainError(s.diagnose(r, outcome, func() (store.Blockers, error) { return s.st.SliceBlockers(ctx, s.query(r)) }))
	}
	out = explained(r, outcome, len(cands))
	out.DemandMix = s.DemandMix(r.sku, r.region)
	return out, nil
}

// explained is a feasible explain answer: the ranking's first choices and why.
func explained(r request, outcome sched.Outcome, free int) apiv1.PlacementExplain {
	var out apiv1.PlacementExplain
	out.Feasible = true
	out.Message = sched.Explain(outcome)
	out.Details = map[string]any{"policy": string(r.policy), "free_slots": free}
	for i, c := range outcome.Choices {
		if i == 5 {
			break
		}
		frag, look := c.FragmentationDelta, c.Lookahead
		out.Choices = append(out.Choices, apiv1.PlacementChoice{NodeID: c.NodeID, NodeName: c.NodeName,
			SlotIndexes: c.SlotIndexes, NUMANodes: c.NUMANodes, Reason: c.Reason,
			FragmentationDelta: &frag, Lookahead: &look, Tier: c.Tier + 1})
	}
	return out
}

// explainInReservation is explain for a create inside a capacity reservation (the actor's
// tenant's): the same ranking over the slots it holds, or why the request does not fit there.
func (s *Service) explainInReservation(ctx context.Context, actor Actor, req apiv1.PlacementRequest) (apiv1.PlacementExplain, error) {
	res, err := s.st.GetReservation(ctx, req.ReservationID, actor.TenantID)
	if errors.Is(err, store.ErrNotFound) {
		return apiv1.PlacementExplain{}, &apiv1.Error{Code: apiv1.CodeNotFound, Message: "reservation not found"}
	}
	if err != nil {
		return apiv1.PlacementExplain{}, err
	}
	actor.TenantID = res.TenantID // an admin asks as the reservation's tenant
	if res.Status != apiv1.ReservationActive {
		return apiv1.PlacementExplain{Feasible: false, Reason: apiv1.ReasonReservationFull,
			Message: fmt.Sprintf("reservation %s has ended (%s)", res.ID, res.Status)}, nil
	}
	if req.SKU == "" {
		req.SKU = res.SKU
	} else if req.SKU != res.SKU {
		return apiv1.PlacementExplain{}, invalid("reservation %s holds %s, not %s", res.ID, res.SKU, req.SKU)
	}
	if req.Region != "" && req.Region != res.Region {
		return apiv1.PlacementExplain{}, invalid("reservation %s is in region %s, not %s", res.ID, res.Region, req.Region)
	}
	r, err := s.resolveRequest(ctx, nil, actor, req.SKU, req.GPUs, "")
	if err != nil {
		return explainError(err)
	}
	r.reservation = res.ID
	cands, err := s.st.ReservationCandidates(ctx, s.query(r), res.ID)
	if err != nil {
		return apiv1.PlacementExplain{}, err
	}
	topo, err := s.st.NodeTopologies(ctx, nodeIDs(cands))
	if err != nil {
		return apiv1.PlacementExplain{}, err
	}
	outcome := sched.PlaceSlice(s.sliceRequest(r), buildNodes(cands, topo))
	if len(outcome.Choices) == 0 {
		return explainError(reservationFull(r, outcome))
	}
	return explained(r, outcome, len(cands)), nil
}

// explainError turns sku_unavailable into an infeasible answer; other errors stay errors.
func explainError(err error) (apiv1.PlacementExplain, error) {
	var ae *apiv1.Error
	if errors.As(err, &ae) && ae.Code == apiv1.CodeSKUUnavailable {
		reason, _ := ae.Details["reason"].(string)
		return apiv1.PlacementExplain{Feasible: false, Reason: reason, Message: ae.Message, Details: ae.Details}, nil
	}
	return apiv1.PlacementExplain{}, err
}

// Capacity reports, per SKU, raw free slots and how many allocations of each allowed size
// could be placed at once (topology-safe capacity), by simulating placements with the real
// ranking on the current candidates.
func (s *Service) Capacity(ctx context.Context, actor Actor, skuFilter, region string) ([]apiv1.Capacity, error) {
	skus, err := s.st.ListSKUs(ctx, true)
	if err != nil {
		return nil, err
	}
	out := []apiv1.Capacity{}
	for _, sku := range skus {
		if skuFilter != "" && sku.SKU != skuFilter {
			continue
		}
		r := request{sku: sku, region: region, tenant: actor.TenantID}
		c := apiv1.Capacity{SKU: sku.SKU, Region: region, CapacityShape: sku.CapacityShape, Launchable: map[string]int{}}
		if actor.isAdmin() {
			c.DemandMix = s.DemandMix(sku, region) // aggregate demand of every tenant: operators only
		}
		if c.Region == "" {
			c.Region = "*"
		}
		if sku.CapacityShape == "baremetal" {
			cands, err := s.st.BaremetalCandidates(ctx, s.query(r))
			if err != nil {
				return nil, err
			}
			c.FreeNodes = len(cands)
			for _, n := range sku.AllowedGPUCounts {
				c.Launchable[strconv.Itoa(n)] = len(cands)
			}
			out = append(out, c)
			continue
		}
		cands, err := s.st.SliceCandidates(ctx, s.query(r))
		if err != nil {
			return nil, err
		}
		topo, err := s.st.NodeTopologies(ctx, nodeIDs(cands))
		if err != nil {
			return nil, err
		}
		b, err := s.st.SliceBlockers(ctx, s.query(r))
		if err != nil {
			return nil, err
		}
		c.RawFreeSlots = len(cands)
		c.BlockedByPolicy = b.FabricPolicy + b.StoragePolicy
		if _, err := s.st.ResolveSliceImage(ctx, sku.SKU, ""); err == nil {
			for _, n := range sku.AllowedGPUCounts {
				c.Launchable[strconv.Itoa(n)] = simulate(buildNodes(cands, topo), sched.Request{GPUs: n, Policy: policyFor(sku, n), Mix: s.mixFor(r)})
			}
		} else {
			for _, n := range sku.AllowedGPUCounts {
				c.Launchable[strconv.Itoa(n)] = 0 // nothing bootable: no viable image
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// simulate counts how many n-GPU placements fit at once, placing greedily with the real ranking.
func simulate(nodes []sched.Node, req sched.Request) int {
	count := 0
	for {
		o := sched.PlaceSlice(req, nodes)
		if len(o.Choices) == 0 {
			return count
		}
		count++
		best := o.Choices[0]
		taken := map[string]bool{}
		for _, id := range best.SlotIDs {
			taken[id] = true
		}
		for i := range nodes {
			if nodes[i].ID != best.NodeID {
				continue
			}
			kept := nodes[i].FreeSlots[:0:0]
			for _, sl := range nodes[i].FreeSlots {
				if !taken[sl.ID] {
					kept = append(kept, sl)
				}
			}
			nodes[i].FreeSlots = kept
			nodes[i].ClaimedSlots += len(best.SlotIDs)
			nodes[i].Allocations++
		}
	}
}
