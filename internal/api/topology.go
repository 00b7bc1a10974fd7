package api

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cpuset"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/topology"
)

func (s *Server) queueDiscovery(w http.ResponseWriter, r *http.Request, p Principal) error {
	if s.dispatch == nil {
		return apiErr(apiv1.CodeUnavailable, "task dispatch is not configured", nil)
	}
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	taskID, err := s.dispatch.QueueTask(r.Context(), id, task.TypeTopologyDiscover, task.TopologyDiscover{IncludeHugepages: true}, 10*time.Minute,
		audit(r, p, "node.topology_discover", "node", id, map[string]any{}))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, apiv1.Discovery{NodeID: id, TaskID: taskID, Status: "queued"})
	return nil
}

// latestDiscovery returns the newest discovery task and its report (nil until it succeeded).
func (s *Server) latestDiscovery(ctx context.Context, nodeID string) (apiv1.Discovery, *topology.Report, error) {
	tr, err := s.store.LatestTask(ctx, nodeID, string(task.TypeTopologyDiscover))
	if errors.Is(err, store.ErrNotFound) {
		return apiv1.Discovery{}, nil, errNotFound("no topology discovery for this node yet; POST .../slice-topology/discovery")
	}
	if err != nil {
		return apiv1.Discovery{}, nil, err
	}
	d := apiv1.Discovery{NodeID: nodeID, TaskID: tr.ID, Status: tr.Status, Error: tr.Error, CompletedAt: tr.CompletedAt, Report: tr.Output}
	if tr.Status != "succeeded" {
		return d, nil, nil
	}
	var rep topology.Report
	if err := json.Unmarshal(tr.Output, &rep); err != nil {
		return d, nil, fmt.Errorf("discovery output: %w", err)
	}
	return d, &rep, nil
}

func (s *Server) getDiscovery(w http.ResponseWriter, r *http.Request, _ Principal) error {
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	d, _, err := s.latestDiscovery(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// deterministicMAC is 52:54:00:xx:yy:ss — xx:yy from the node id (and, after the first try,
// the try), ss the slot index — so a node's slots keep their MACs across re-approval.
func deterministicMAC(nodeID string, slot, try int) string {
	seed := nodeID
	if try > 0 {
		seed = fmt.Sprintf("%s/%d", nodeID, try)
	}
	h := sha256.Sum256([]byte(seed))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], slot&0xff)
}

// macTries bounds the search for a free MAC: with 65,536 prefixes, each try of a fleet whose
// every prefix but a few is taken still usually finds one.
const macTries = 32

// freeMACs gives each newly approved slot (indexes) a MAC that no other node's enabled slot
// holds: a MAC is unique in the fleet, and two bytes of a node id's hash meet another node's
// by chance in a fleet of a few hundred nodes. The first try is the deterministic MAC, so
// re-approval keeps a slot's MAC; a try whose MAC is taken moves the slot to the next.
func (s *Server) freeMACs(ctx context.Context, nodeID string, indexes []int) (map[int]string, error) {
	out := map[int]string{}
	pending := indexes
	for try := 0; len(pending) > 0; try++ {
		if try == macTries {
			return nil, apiErr(apiv1.CodeConflict, fmt.Sprintf("no free MAC address for slots %v after %d tries: set mac_address with slots apply", pending, macTries), nil)
		}
		macs := make([]string, len(pending))
		for i, idx := range pending {
			macs[i] = deterministicMAC(nodeID, idx, try)
		}
		held, err := s.store.MACHolders(ctx, nodeID, macs)
		if err != nil {
			return nil, err
		}
		var next []int
		for i, idx := range pending {
			if _, taken := held[store.MACKey(macs[i])]; taken {
				next = append(next, idx)
			} else {
				out[idx] = macs[i]
			}
		}
		pending = next
	}
	return out, nil
}

// approveSlots promotes ready candidates of the latest discovery into the node's slot map.
func (s *Server) approveSlots(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.SlotApprove
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if !req.AllReady && len(req.SlotIndexes) == 0 {
		return errInvalid("name slot_indexes or set all_ready")
	}
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	d, rep, err := s.latestDiscovery(r.Context(), id)
	if err != nil {
		return err
	}
	if rep == nil {
		return apiErr(apiv1.CodeConflict, "the latest discovery has not succeeded (status "+d.Status+")", nil)
	}
	want := map[int]bool{}
	for _, i := range req.SlotIndexes {
		want[i] = true
	}
	existing, err := s.store.ListSlots(r.Context(), id)
	if err != nil {
		return err
	}
	specs := map[int]apiv1.SlotSpec{}
	for _, sl := range existing {
		if sl.Status != "disabled" {
			specs[sl.SlotIndex] = slotSpecOf(sl)
		}
	}
	approved := []int{}
	for _, c := range rep.Candidates {
		if !(req.AllReady && c.Ready) && !want[c.SlotIndex] {
			continue
		}
		if !c.Ready {
			return apiErr(apiv1.CodeConflict, fmt.Sprintf("candidate %d is blocked: %v", c.SlotIndex, c.BlockingReasons), nil)
		}
		delete(want, c.SlotIndex)
		mem := 65536
		fabric := c.Fabric
		if fabric == "unknown" || fabric == "" || fabric == topology.LabFabric {
			fabric = "none" // a lab stand-in is no fabric; its VF still goes to the slot
		}
		specs[c.SlotIndex] = apiv1.SlotSpec{SlotIndex: c.SlotIndex, GPUModel: c.GPUModel, PCIAddress: c.GPUPCI, NVMeDevice: c.NVMeDevice,
			NetworkFabric: fabric, FabricPCIAddress: c.FabricParentPCI, NUMANode: c.NUMANode, MemoryMiB: &mem,
			PrivateIP: fmt.Sprintf("10.100.0.%d", 10+c.SlotIndex),
			CapacityMetadata: map[string]any{"storage_ownership": "slice", "destructive_wipe_policy": "blkdiscard_zero_verify",
				"fabric_claim_mode": "per_slot_vf", "fabric_vf_pci_address": c.FabricVFPCI, "discovery_task_id": d.TaskID}}
		approved = append(approved, c.SlotIndex)
	}
	if len(want) > 0 {
		return errInvalid("no such candidates: %v", keys(want))
	}
	macs, err := s.freeMACs(r.Context(), id, approved)
	if err != nil {
		return err
	}
	for idx, mac := range macs {
		sp := specs[idx]
		sp.MACAddress = mac
		specs[idx] = sp
	}
	all := make([]apiv1.SlotSpec, 0, len(specs))
	for _, sp := range specs {
		all = append(all, sp)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].SlotIndex < all[j].SlotIndex })
	if err := ValidateSlotMap(all); err != nil {
		return err
	}
	var out apiv1.SlotApplyResult
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		plan, err := planHostCPUs(r.Context(), tx, id, all, req.HousekeepingCPUs, rep)
		if err != nil {
			return err
		}
		for i := range all {
			if all[i].VCPUCount == nil && slices.Contains(approved, all[i].SlotIndex) { // the default, within the CPU set
				vcpu := approvedVCPUs
				if n := cpusIn(all[i].HostCPUs); n > 0 && n < vcpu {
					vcpu = n
				}
				all[i].VCPUCount = &vcpu
			}
		}
		if out, err = tx.ApplySlots(r.Context(), id, all, req.DryRun); err != nil {
			return err
		}
		if err := storePlan(r.Context(), tx, id, plan, req.DryRun, &out); err != nil || req.DryRun {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "node.slots.approve", "node", id, map[string]any{"slot_indexes": approved,
			"discovery_task_id": d.TaskID, "housekeeping_cpus": out.HousekeepingCPUs}))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// approvedVCPUs is an approved candidate's vcpu_count (seed 001's one-GPU slice), lowered to
// the size of its host CPU set when that is smaller: a slot never asks for more vCPUs than it
// owns CPUs.
const approvedVCPUs = 24

func cpusIn(list string) int {
	c, _ := cpuset.Parse(list)
	return len(c)
}

func keys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// slotSpecOf turns a stored slot back into its declarative spec.
func slotSpecOf(sl apiv1.Slot) apiv1.SlotSpec {
	md := map[string]any{}
	_ = json.Unmarshal(sl.CapacityMetadata, &md)
	cm, mc := sl.ComputeMilli, sl.MaxClaims
	return apiv1.SlotSpec{SlotIndex: sl.SlotIndex, GPUModel: sl.GPUModel, PCIAddress: sl.PCIAddress, GPUUUID: sl.GPUUUID,
		GPUMemoryMiB: sl.GPUMemoryMiB, NVMeDevice: sl.NVMeDevice, NetworkFabric: sl.NetworkFabric, NetworkDevice: sl.NetworkDevice,
		FabricPCIAddress: sl.FabricPCIAddress, FabricDeviceID: sl.FabricDeviceID, NUMANode: sl.NUMANode, VCPUCount: sl.VCPUCount,
		MemoryMiB: sl.MemoryMiB, HostCPUs: sl.HostCPUs, MACAddress: sl.MACAddress, PrivateIP: sl.PrivateIP, CapacityMetadata: md,
		SharingModel: sl.SharingModel, ProfileName: sl.ProfileName, ComputeMilli: &cm, MaxClaims: &mc}
}

func (s *Server) storageTransition(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.StorageTransitionRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if len(req.Devices) == 0 || len(req.Devices) > 64 {
		return errInvalid("devices: name 1..64 raw devices")
	}
	for _, d := range req.Devices {
		if err := task.CheckDevicePath(d); err != nil {
			return errInvalid("%v", err)
		}
	}
	n, err := s.store.GetNode(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("node " + r.PathValue("id") + " not found")
	}
	if err != nil {
		return err
	}
	if req.Apply && req.Confirm != n.Name {
		return errInvalid("apply destroys data on %d devices: set confirm to the node name %q", len(req.Devices), n.Name)
	}
	if s.dispatch == nil {
		return apiErr(apiv1.CodeUnavailable, "task dispatch is not configured", nil)
	}
	taskID, err := s.dispatch.QueueTask(r.Context(), n.ID, task.TypeStorageTransit,
		task.StorageTransition{Devices: req.Devices, To: "slice", Apply: req.Apply, Node: n.Name}, 30*time.Minute,
		audit(r, p, "node.storage_transition", "node", n.ID, map[string]any{"devices": req.Devices, "apply": req.Apply}))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"task_id": taskID})
	return nil
}

func (s *Server) wipeSlot(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req struct {
		Apply bool `json:"apply"`
	}
	if err := decode(w, r, &req); err != nil {
		return err
	}
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
	if slot.Status != "cleanup_blocked" && slot.Status != "failed" && (slot.Status != "disabled" || !slot.NeedsWipe) {
		return apiErr(apiv1.CodeConflict, fmt.Sprintf("slot %d is %s; only cleanup_blocked or failed slots, or disabled slots that need a wipe, take a repair wipe", slot.SlotIndex, slot.Status), nil)
	}
	if s.dispatch == nil {
		return apiErr(apiv1.CodeUnavailable, "task dispatch is not configured", nil)
	}
	taskID, err := s.dispatch.QueueTask(r.Context(), id, task.TypeWipeVerify, wipeVerify(slot, req.Apply), 2*time.Hour,
		audit(r, p, "slot.wipe_requested", "slot", slot.ID, map[string]any{"device": slot.NVMeDevice, "apply": req.Apply}))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"task_id": taskID})
	return nil
}

// wipeVerify is the repair wipe of a slot: its disk, by its own policy, checked against its
// recorded identity.
func wipeVerify(slot *apiv1.Slot, apply bool) task.WipeVerify {
	var md struct {
		Policy   string `json:"destructive_wipe_policy"`
		Identity string `json:"disk_identity"`
	}
	_ = json.Unmarshal(slot.CapacityMetadata, &md)
	return task.WipeVerify{SlotID: slot.ID, Device: slot.NVMeDevice, Apply: apply, Policy: md.Policy, DiskIdentity: md.Identity}
}
