package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

var (
	nodeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)
	tagRE      = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
)

func (s *Server) present(n apiv1.Node) apiv1.Node {
	n.Mode, n.Schedulable = alloc.DeriveMode(n, s.alloc.HeartbeatMaxAge(), time.Now())
	if n.Simulated {
		if s.alloc.AllowSimulated() {
			n.Schedulable.Reasons = append(n.Schedulable.Reasons, "simulated host (sim runtime or lab host): sold only because the controller allows simulated hosts")
		} else {
			n.Schedulable.Reasons = append(n.Schedulable.Reasons, "simulated host (sim runtime or lab host): not sold; start the controller with --allow-simulated-hosts for demos and tests")
			n.Schedulable.Baremetal, n.Schedulable.Slice = false, false
		}
	}
	return n
}

func (s *Server) createNode(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.NodeCreate
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if !nodeNameRE.MatchString(req.Name) {
		return errInvalid("node name must match %s", nodeNameRE)
	}
	if req.Region == "" || len(req.Region) > 64 {
		return errInvalid("region is required (at most 64 characters)")
	}
	for _, t := range append(append([]string{}, req.ProfileTags...), req.HardwareTags...) {
		if !tagRE.MatchString(t) {
			return errInvalid("tag %q must match %s", t, tagRE)
		}
	}
	var out apiv1.Node
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		for _, sku := range []struct{ name, shape string }{{req.SKU, "baremetal"}, {req.SliceSKU, "gpu_slice"}} {
			if sku.name == "" {
				continue
			}
			got, err := tx.GetSKU(r.Context(), sku.name)
			if errors.Is(err, store.ErrNotFound) {
				return errInvalid("unknown SKU %q", sku.name)
			}
			if err != nil {
				return err
			}
			if got.CapacityShape != sku.shape {
				return errInvalid("SKU %s is %s; expected a %s SKU here", got.SKU, got.CapacityShape, sku.shape)
			}
		}
		var err error
		if out, err = tx.CreateNode(r.Context(), req); err != nil {
			return err
		}
		if out.BootstrapToken, out.BootstrapTokenExpiresAt, err = issueBootstrapToken(r, tx, out.ID); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "node.create", "node", out.ID, req))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.present(out))
	return nil
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, _ Principal) error {
	items, err := s.store.ListNodes(r.Context())
	if err != nil {
		return err
	}
	for i := range items {
		items[i] = s.present(items[i])
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Node]{Items: items})
	return nil
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request, _ Principal) error {
	n, err := s.store.GetNode(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("node " + r.PathValue("id") + " not found")
	}
	if err != nil {
		return err
	}
	out := s.present(n)
	kinds, err := s.store.QueuedTaskKinds(r.Context(), n.ID)
	if err != nil {
		return err
	}
	for k, count := range kinds {
		v, _ := strconv.Atoi(k[1])
		if why := task.WaitReason(n.AgentFacts, k[0], v); why != "" {
			out.Waiting = append(out.Waiting, fmt.Sprintf("%d %s schema %d task(s) queued: %s", count, k[0], v, why))
		}
	}
	sort.Strings(out.Waiting)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) drainNode(drain bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p Principal) error {
		var out apiv1.Node
		var reason string
		var deadline time.Time
		if drain {
			var err error
			if reason, deadline, err = maintenanceRequest(w, r, time.Now()); err != nil {
				return err
			}
		}
		err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
			var err error
			if out, err = tx.SetDraining(r.Context(), r.PathValue("id"), drain); err != nil {
				return err
			}
			action := "node.undrain"
			if drain {
				action = "node.drain"
			}
			details := map[string]any{"name": out.Name}
			if !deadline.IsZero() {
				n, err := tx.CreateMaintenanceNotice(r.Context(), out.ID, reason, deadline, p.Name)
				if err != nil {
					return err
				}
				details["maintenance"] = map[string]any{"notice_id": n.ID, "deadline": n.Deadline, "reason": reason, "allocations": len(n.Allocations)}
			}
			return tx.Audit(r.Context(), audit(r, p, action, "node", out.ID, details))
		})
		if errors.Is(err, store.ErrNotFound) {
			return errNotFound("node " + r.PathValue("id") + " not found")
		}
		if err != nil {
			return err
		}
		if !deadline.IsZero() {
			s.notifyEvents(r.Context())
		}
		writeJSON(w, http.StatusOK, s.present(out))
		return nil
	}
}

func (s *Server) nodeID(r *http.Request) (string, error) {
	n, err := s.store.GetNode(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return "", errNotFound("node " + r.PathValue("id") + " not found")
	}
	return n.ID, err
}

func (s *Server) listSlots(w http.ResponseWriter, r *http.Request, _ Principal) error {
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	items, err := s.store.ListSlots(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.Slot]{Items: items})
	return nil
}

func (s *Server) applySlots(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.SlotApply
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := ValidateSlotMap(req.Slots); err != nil {
		return err
	}
	id, err := s.nodeID(r)
	if err != nil {
		return err
	}
	rep, err := s.discoveryReport(r.Context(), id)
	if err != nil {
		return err
	}
	var out apiv1.SlotApplyResult
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		specs := append([]apiv1.SlotSpec(nil), req.Slots...) // filled afresh on a retried transaction
		plan, err := planHostCPUs(r.Context(), tx, id, specs, req.HousekeepingCPUs, rep)
		if err != nil {
			return err
		}
		if out, err = tx.ApplySlots(r.Context(), id, specs, req.DryRun); err != nil {
			return err
		}
		if err := storePlan(r.Context(), tx, id, plan, req.DryRun, &out); err != nil || req.DryRun {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "node.slots.apply", "node", id, map[string]any{"changes": out.Changes,
			"housekeeping_cpus": out.HousekeepingCPUs}))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) setSlotEnabled(enabled bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p Principal) error {
		idx, err := pathSlotIndex(r)
		if err != nil {
			return err
		}
		id, err := s.nodeID(r)
		if err != nil {
			return err
		}
		var out apiv1.Slot
		err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
			action, reason := "slot.enable", ""
			if !enabled {
				action, reason = "slot.disable", "disabled by "+p.Name
			}
			var err error
			if out, err = tx.SetSlotEnabled(r.Context(), id, idx, enabled, reason); err != nil {
				return err
			}
			return tx.Audit(r.Context(), audit(r, p, action, "slot", out.ID, map[string]any{"node_id": id, "slot_index": idx}))
		})
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

var (
	macRE = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	// partitionName is udev's by-id name of a partition: its disk's name plus -partN.
	partitionName = regexp.MustCompile(`-part[0-9]+$`)
	// diskIdentityRE: a slot disk's recorded identity, as hostd compares it with the device.
	diskIdentityRE = regexp.MustCompile(`^(serial|wwn|eui64|nguid):[A-Za-z0-9._:-]{1,128}$`)
	storageOwn     = map[string]bool{"slice": true, "host_share": true, "unassigned": true}
	fabricMode     = map[string]bool{"per_slot_vf": true, "exclusive_device": true, "shared_host": true}
	fabrics        = map[string]bool{"": true, "infiniband": true, "roce": true, "ethernet": true, "none": true}
	sharing        = map[string]bool{"": true, "exclusive_device": true, "mig_partition": true, "mdev_vgpu": true, "time_sliced": true, "mps": true, "software_shared": true}
)

// maxCapacityMetadata bounds a slot's capacity_metadata as JSON (a few keys in practice).
const maxCapacityMetadata = 16 << 10

// ValidateSlotMap checks a declarative slot map before anything is written: identities must
// be well formed and unique within the node (a GPU, disk, VF, MAC or IP in two slots would let
// two tenants share hardware). Slots may still lack policy keys: they are stored but not
// schedulable, and capacity reports them as blocked by policy.
func ValidateSlotMap(specs []apiv1.SlotSpec) error {
	if len(specs) > 256 {
		return errInvalid("a slot map holds at most 256 slots")
	}
	// Keyed as the database compares them (migration 017): a GPU and a fabric VF are both PCI
	// functions passed through, so one namespace; a MAC without case or separators; an IP by
	// its address.
	type holder struct {
		idx   int
		field string
	}
	seen := map[string]map[string]holder{"slot_index": {}, "pci": {}, "nvme_device": {}, "mac_address": {}, "private_ip": {}}
	dup := func(space, field, v, key string, idx int) error {
		if key == "" {
			return nil
		}
		if prev, ok := seen[space][key]; ok {
			if prev.field != field {
				return errInvalid("slots %d and %d share PCI function %s (slot %d's %s, slot %d's %s): a device identity belongs to one slot",
					prev.idx, idx, v, prev.idx, prev.field, idx, field)
			}
			return errInvalid("slots %d and %d share %s %s: a device identity belongs to one slot", prev.idx, idx, field, v)
		}
		seen[space][key] = holder{idx, field}
		return nil
	}
	indexes := map[int]bool{}
	for _, sp := range specs {
		indexes[sp.SlotIndex] = true
	}
	for _, sp := range specs {
		i := sp.SlotIndex
		if p := sp.ParentSlotIndex; p != nil && (*p == i || !indexes[*p]) {
			return errInvalid("slot %d: parent_slot_index %d must name another slot in the map", i, *p)
		}
		if i < 0 || i > maxSlotIndex {
			return errInvalid("slot_index %d out of range 0..%d", i, maxSlotIndex)
		}
		// Free-form metadata is stored and printed back with every slot listing: bounded, so
		// one slot cannot make `slots list` print megabytes (depth is bounded at the decoder).
		if b, err := json.Marshal(sp.CapacityMetadata); err != nil || len(b) > maxCapacityMetadata {
			return errInvalid("slot %d: capacity_metadata is larger than %d bytes of JSON", i, maxCapacityMetadata)
		}
		if err := dup("slot_index", "slot_index", strconv.Itoa(i), strconv.Itoa(i), i); err != nil {
			return err
		}
		if task.CheckPCIAddress(sp.PCIAddress) != nil {
			return errInvalid("slot %d: pci_address %q must look like 0000:3c:00.0", i, sp.PCIAddress)
		}
		if task.CheckByIDPath(sp.NVMeDevice) != nil {
			return errInvalid("slot %d: nvme_device must be a stable /dev/disk/by-id/ path, never /dev/nvmeXnY (got %q)", i, sp.NVMeDevice)
		}
		if partitionName.MatchString(sp.NVMeDevice) {
			return errInvalid("slot %d: nvme_device %q names a partition: a slot owns a whole disk (name the disk, not -partN)", i, sp.NVMeDevice)
		}
		if !macRE.MatchString(sp.MACAddress) {
			return errInvalid("slot %d: mac_address %q must be lowercase aa:bb:cc:dd:ee:ff", i, sp.MACAddress)
		}
		if ip := net.ParseIP(sp.PrivateIP); ip == nil || ip.To4() == nil {
			return errInvalid("slot %d: private_ip %q must be an IPv4 address", i, sp.PrivateIP)
		}
		if sp.FabricPCIAddress != "" && task.CheckPCIAddress(sp.FabricPCIAddress) != nil {
			return errInvalid("slot %d: fabric_pci_address %q is not a PCI address", i, sp.FabricPCIAddress)
		}
		if sp.NUMANode != nil && (*sp.NUMANode < 0 || *sp.NUMANode > 63) {
			return errInvalid("slot %d: numa_node must be 0..63 or null (unknown)", i)
		}
		if sp.VCPUCount != nil && *sp.VCPUCount <= 0 || sp.MemoryMiB != nil && *sp.MemoryMiB <= 0 || sp.GPUMemoryMiB < 0 {
			return errInvalid("slot %d: vcpu_count, memory_mib and gpu_memory_mib must be positive", i)
		}
		if !fabrics[sp.NetworkFabric] {
			return errInvalid("slot %d: network_fabric must be infiniband, roce, ethernet or none", i)
		}
		if !sharing[sp.SharingModel] {
			return errInvalid("slot %d: unknown sharing_model %q", i, sp.SharingModel)
		}
		if sp.ComputeMilli != nil && *sp.ComputeMilli < 0 || sp.MaxClaims != nil && *sp.MaxClaims < 1 {
			return errInvalid("slot %d: compute_milli must be >= 0 and max_claims >= 1", i)
		}
		md := sp.CapacityMetadata
		if v, ok := md["storage_ownership"]; ok {
			if s, _ := v.(string); !storageOwn[s] {
				return errInvalid("slot %d: capacity_metadata.storage_ownership must be slice, host_share or unassigned", i)
			}
		}
		if v, ok := md["fabric_claim_mode"]; ok {
			if s, _ := v.(string); !fabricMode[s] {
				return errInvalid("slot %d: capacity_metadata.fabric_claim_mode must be per_slot_vf, exclusive_device or shared_host", i)
			}
		}
		for _, k := range []string{"destructive_wipe_policy", "sku", "fabric_vf_pci_address", "disk_identity"} {
			if v, ok := md[k]; ok {
				if _, isStr := v.(string); !isStr {
					return errInvalid("slot %d: capacity_metadata.%s must be a string", i, k)
				}
			}
		}
		// A disk hostd could not erase by its policy is never put on sale.
		if p, _ := md["destructive_wipe_policy"].(string); p != "" {
			if err := task.CheckWipePolicy(p); err != nil {
				return errInvalid("slot %d: capacity_metadata.%s", i, err.Error())
			}
		}
		if id, _ := md["disk_identity"].(string); id != "" && !diskIdentityRE.MatchString(id) {
			return errInvalid("slot %d: capacity_metadata.disk_identity %q must be serial:, wwn:, eui64: or nguid: and the value the device reports", i, id)
		}
		vf, _ := md["fabric_vf_pci_address"].(string)
		if vf != "" && task.CheckPCIAddress(vf) != nil {
			return errInvalid("slot %d: capacity_metadata.fabric_vf_pci_address %q is not a PCI address", i, vf)
		}
		for _, id := range []struct{ space, field, v, key string }{
			{"pci", "pci_address", sp.PCIAddress, strings.ToLower(sp.PCIAddress)},
			{"pci", "fabric_vf_pci_address", vf, strings.ToLower(vf)},
			{"nvme_device", "nvme_device", sp.NVMeDevice, sp.NVMeDevice},
			{"mac_address", "mac_address", sp.MACAddress, store.MACKey(sp.MACAddress)},
			{"private_ip", "private_ip", sp.PrivateIP, net.ParseIP(sp.PrivateIP).String()},
		} {
			if err := dup(id.space, id.field, id.v, id.key, i); err != nil {
				return err
			}
		}
	}
	return nil
}
