package alloc

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// SliceProfileTag is the MAAS tag that records slice-VM intent for a node (seed 003).
const SliceProfileTag = "gpuaas-profile-slice-vm"

// DeriveMode computes a node's mode and schedulability from its status, admin intent,
// approved slots and live claims (seed 001 "Mixed Node State"). Mode is derived, never stored.
func DeriveMode(n apiv1.Node, heartbeatMaxAge time.Duration, now time.Time) (string, apiv1.Schedulable) {
	sum := n.SlotSummary
	approved := sum.Total - sum.ByStatus[SlotDisabled]
	blocked := sum.ByStatus[SlotCleanupBlocked] + sum.ByStatus[SlotFailed]
	sliceIntent := slices.Contains(n.ProfileTags, SliceProfileTag)
	var reasons []string
	sched := apiv1.Schedulable{Baremetal: n.SKU != "", Slice: approved > 0 && n.SliceSKU != ""}
	if n.SKU == "" {
		reasons = append(reasons, "no baremetal SKU set")
	}
	if approved == 0 {
		reasons = append(reasons, "no approved slice slots")
	} else if n.SliceSKU == "" {
		reasons = append(reasons, "approved slots but no slice SKU set")
	}
	if n.Status != "active" {
		reasons = append(reasons, "node status is "+n.Status)
		sched.Baremetal, sched.Slice = false, false
	}
	if n.Draining {
		reasons = append(reasons, "draining: no new placements; live allocations continue")
		sched.Baremetal, sched.Slice = false, false
	}
	unreachable := false
	if heartbeatMaxAge > 0 {
		unreachable = n.LastHeartbeatAt == nil || now.Sub(*n.LastHeartbeatAt) > heartbeatMaxAge
		if n.LastHeartbeatAt == nil {
			reasons = append(reasons, "no agent heartbeat yet")
			sched.Baremetal, sched.Slice = false, false
		} else if age := now.Sub(*n.LastHeartbeatAt); age > heartbeatMaxAge {
			reasons = append(reasons, fmt.Sprintf("agent heartbeat stale (%s ago)", age.Round(time.Second)))
			sched.Baremetal, sched.Slice = false, false
		}
	}
	var facts struct {
		Prereq *struct {
			Ready  bool     `json:"ready"`
			Failed []string `json:"failed"`
		} `json:"prerequisites"`
	}
	if json.Unmarshal(n.AgentFacts, &facts) == nil && facts.Prereq != nil && !facts.Prereq.Ready {
		reasons = append(reasons, "host prerequisites failing: "+strings.Join(facts.Prereq.Failed, ", "))
		sched.Slice = false
	}
	if sum.LiveExclusiveClaims > 0 {
		reasons = append(reasons, "baremetal allocation holds the node")
		sched.Baremetal, sched.Slice = false, false
	}
	if sum.LiveSlotClaims > 0 || sum.ByStatus[SlotCleanup] > 0 || blocked > 0 {
		reasons = append(reasons, "slice claims or uncleaned slots block baremetal")
		sched.Baremetal = false
	}
	if blocked > 0 {
		reasons = append(reasons, fmt.Sprintf("%d slots cleanup_blocked/failed (blocked alone)", blocked))
	}
	sched.Reasons = reasons
	if !sliceIntent {
		sched.SliceMissing = append(sched.SliceMissing, "profile tag "+SliceProfileTag)
	}
	if !FirmwareVerified(n.FirmwareProfile) {
		sched.SliceMissing = append(sched.SliceMissing, "verified firmware profile evidence")
	}
	if approved == 0 {
		sched.SliceMissing = append(sched.SliceMissing, "approved slots")
	}
	sched.SliceSupported = len(sched.SliceMissing) == 0

	var mode string
	switch {
	case n.Status != "active":
		mode = apiv1.ModeUnavailable
	case n.Draining:
		mode = apiv1.ModeDraining
	case unreachable:
		mode = apiv1.ModeUnreachable // running allocations are untouched
	case sum.LiveExclusiveClaims > 0:
		mode = apiv1.ModeBaremetalActive
	case sum.LiveSlotClaims > 0:
		mode = apiv1.ModeSliceActive
	case blocked > 0 && blocked >= approved:
		mode = apiv1.ModeCleanupBlocked
	case approved > 0 && n.SKU != "":
		mode = apiv1.ModeBothCapable
	case approved > 0:
		mode = apiv1.ModeSliceCandidate // slots approved, but no baremetal product: slice-only
	case sliceIntent:
		mode = apiv1.ModeSliceCandidate
	default:
		mode = apiv1.ModeBaremetalOnly
	}
	return mode, sched
}

// FirmwareVerified reports whether firmware-profile evidence says verified: either the
// document itself ({"status": "verified"}) or any evidence file in the map hostd reports.
func FirmwareVerified(doc json.RawMessage) bool {
	var m map[string]any
	if json.Unmarshal(doc, &m) != nil {
		return false
	}
	if m["status"] == "verified" {
		return true
	}
	for _, v := range m {
		if e, ok := v.(map[string]any); ok && e["status"] == "verified" {
			return true
		}
	}
	return false
}
