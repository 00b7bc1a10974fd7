package api

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cpuset"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/topology"
)

// cpuPlan is a slot map's host CPU side: the node's housekeeping set and whether this request
// decides it (then it is stored with the map).
type cpuPlan struct {
	housekeeping []int
	decided      bool
}

// planHostCPUs settles the housekeeping set of a slot map about to be applied to a node and
// fills the host_cpus of its slots that name none from rep (the node's latest successful
// discovery; nil when there is none, and then such slots stay without a set). The
// housekeeping set is the request's when it names one, else the node's, else, when slots are
// filled, the default (the first core of each NUMA node). It then checks the whole map:
// every set parses, lies on its slot's NUMA node (when rep knows the node's CPUs), takes no
// housekeeping CPU and no other slot's CPU, and covers the slot's vcpu_count. The database
// checks the same again at commit; this check answers dry runs and names both slots first.
func planHostCPUs(ctx context.Context, tx *store.Tx, nodeID string, specs []apiv1.SlotSpec, hkReq *string, rep *topology.Report) (cpuPlan, error) {
	var p cpuPlan
	if hkReq != nil {
		hk, err := cpuset.Parse(*hkReq)
		if err != nil {
			return p, errInvalid("housekeeping_cpus: %v", err)
		}
		p.housekeeping, p.decided = hk, true
	} else {
		hk, set, err := tx.Housekeeping(ctx, nodeID)
		if err != nil {
			return p, err
		}
		p.housekeeping = hk
		if !set && rep != nil && anyWithoutCPUs(specs) {
			if p.housekeeping, err = topology.DefaultHousekeeping(rep.NUMA); err != nil {
				return p, errInvalid("discovery report: %v", err)
			}
			p.decided = true
		}
	}
	var slots []topology.SlotCPUs
	for _, sp := range specs {
		cpus, err := cpuset.Parse(sp.HostCPUs)
		if err != nil {
			return p, errInvalid("slot %d: host_cpus: %v", sp.SlotIndex, err)
		}
		slots = append(slots, topology.SlotCPUs{SlotIndex: sp.SlotIndex, NUMANode: sp.NUMANode, HostCPUs: cpus})
	}
	if rep != nil && anyWithoutCPUs(specs) {
		expected := map[int]int{} // a slot per GPU on each NUMA node
		for _, g := range rep.GPUs {
			if g.NUMANode != nil {
				expected[*g.NUMANode]++
			}
		}
		filled, err := topology.AssignHostCPUs(rep.NUMA, p.housekeeping, slots, expected)
		if err != nil {
			return p, errInvalid("host CPUs: %v", err)
		}
		for i := range specs {
			if set, ok := filled[specs[i].SlotIndex]; ok {
				specs[i].HostCPUs = cpuset.Format(set)
			}
		}
	}
	return p, validateHostCPUs(specs, p.housekeeping, rep)
}

func anyWithoutCPUs(specs []apiv1.SlotSpec) bool {
	for _, sp := range specs {
		if sp.HostCPUs == "" {
			return true
		}
	}
	return false
}

// validateHostCPUs refuses a map in which a slot's CPU set overlaps another slot's or the
// housekeeping set, leaves its NUMA node, or is smaller than its vcpu_count; each refusal
// names the slot, and for an overlap the slot that holds the CPUs.
func validateHostCPUs(specs []apiv1.SlotSpec, housekeeping []int, rep *topology.Report) error {
	var nodeOf map[int]int
	if rep != nil {
		var err error
		if nodeOf, err = topology.NodeOfCPUs(rep.NUMA); err != nil {
			return errInvalid("discovery report: %v", err)
		}
	}
	sorted := append([]apiv1.SlotSpec(nil), specs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].SlotIndex < sorted[j].SlotIndex })
	owner := map[int]int{}
	for _, sp := range sorted {
		cpus, err := cpuset.Parse(sp.HostCPUs)
		if err != nil {
			return errInvalid("slot %d: host_cpus: %v", sp.SlotIndex, err)
		}
		if sp.VCPUCount != nil && len(cpus) > 0 && *sp.VCPUCount > len(cpus) {
			return errInvalid("slot %d asks for %d vCPUs but owns only %d host CPUs (%s): lower its vcpu_count or give it more CPUs",
				sp.SlotIndex, *sp.VCPUCount, len(cpus), sp.HostCPUs)
		}
		if hk := cpuset.Overlap(cpus, housekeeping); len(hk) > 0 {
			return errInvalid("slot %d cannot own host CPUs %s: they are the node's housekeeping CPUs", sp.SlotIndex, cpuset.Format(hk))
		}
		byHolder := map[int][]int{}
		for _, c := range cpus {
			if h, ok := owner[c]; ok {
				byHolder[h] = append(byHolder[h], c)
			}
			if n, ok := nodeOf[c]; nodeOf != nil && sp.NUMANode != nil && (!ok || n != *sp.NUMANode) {
				where := "on no NUMA node discovery found"
				if ok {
					where = fmt.Sprintf("on NUMA node %d", n)
				}
				return errInvalid("slot %d: host CPU %d is %s, not on the slot's node %d", sp.SlotIndex, c, where, *sp.NUMANode)
			}
		}
		if len(byHolder) > 0 {
			holders := make([]int, 0, len(byHolder))
			for h := range byHolder {
				holders = append(holders, h)
			}
			sort.Ints(holders)
			h := holders[0]
			return errInvalid("slot %d cannot own host CPUs %s: slot %d holds them", sp.SlotIndex, cpuset.Format(byHolder[h]), h)
		}
		for _, c := range cpus {
			owner[c] = sp.SlotIndex
		}
	}
	return nil
}

// discoveryReport is the node's latest successful discovery, or nil when it has none (or the
// latest has not succeeded).
func (s *Server) discoveryReport(ctx context.Context, nodeID string) (*topology.Report, error) {
	_, rep, err := s.latestDiscovery(ctx, nodeID)
	var ae *apiv1.Error
	if errors.As(err, &ae) && ae.Code == apiv1.CodeNotFound {
		return nil, nil
	}
	return rep, err
}

// storePlan records a decided housekeeping set with the map (not on a dry run) and reports it.
func storePlan(ctx context.Context, tx *store.Tx, nodeID string, p cpuPlan, dryRun bool, out *apiv1.SlotApplyResult) error {
	out.HousekeepingCPUs = cpuset.Format(p.housekeeping)
	if !p.decided || dryRun {
		return nil
	}
	return tx.SetHousekeeping(ctx, nodeID, p.housekeeping)
}
