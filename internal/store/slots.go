package store

import (
	"time"

	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cpuset"
)

const slotColumns = `s.id::text, s.node_id::text, s.slot_index, s.capacity_shape, s.status, s.status_reason,
	coalesce(s.parent_slot_id::text, ''), s.sharing_model, s.profile_name, s.gpu_model, s.gpu_count, s.pci_address,
	s.gpu_uuid, s.mig_profile, s.gpu_memory_mib, s.compute_milli, s.max_claims, s.nvme_device, s.network_fabric,
	s.network_device, s.fabric_pci_address, s.fabric_device_id, s.fabric_metadata, s.numa_node, s.vcpu_count,
	s.memory_mib, s.host_cpus, s.mac_address, coalesce(host(s.private_ip), ''), s.capacity_metadata, s.health_metadata,
	coalesce((SELECT c.allocation_id::text FROM allocation_resource_claims c
	          WHERE c.slot_id = s.id AND c.status IN ` + liveClaim + ` LIMIT 1), ''), s.updated_at, s.needs_wipe,
	s.health, s.health_reason, s.health_since,
	coalesce(s.staged_image_id::text, ''), coalesce(s.staged_digest_sha256, ''), s.staged_at, coalesce(s.staged_after_proof, 0)`

func scanSlot(row pgx.Row, s *apiv1.Slot) error {
	var cpus []int
	var st apiv1.SlotStagedImage
	var stagedAt *time.Time
	err := row.Scan(&s.ID, &s.NodeID, &s.SlotIndex, &s.CapacityShape, &s.Status, &s.StatusReason, &s.ParentSlotID,
		&s.SharingModel, &s.ProfileName, &s.GPUModel, &s.GPUCount, &s.PCIAddress, &s.GPUUUID, &s.MIGProfile,
		&s.GPUMemoryMiB, &s.ComputeMilli, &s.MaxClaims, &s.NVMeDevice, &s.NetworkFabric, &s.NetworkDevice,
		&s.FabricPCIAddress, &s.FabricDeviceID, &s.FabricMetadata, &s.NUMANode, &s.VCPUCount, &s.MemoryMiB,
		&cpus, &s.MACAddress, &s.PrivateIP, &s.CapacityMetadata, &s.HealthMetadata, &s.AllocationID, &s.UpdatedAt, &s.NeedsWipe,
		&s.Health, &s.HealthReason, &s.HealthSince, &st.ImageID, &st.DigestSHA256, &stagedAt, &st.AfterProof)
	s.HostCPUs = cpuset.Format(cpus)
	if st.DigestSHA256 != "" && stagedAt != nil {
		st.StagedAt = *stagedAt
		s.StagedImage = &st
	}
	return err
}

// ListSlots returns a node's slots by index.
func (s *Store) ListSlots(ctx context.Context, nodeID string) ([]apiv1.Slot, error) {
	return listSlots(ctx, s.pool, nodeID, false)
}

func listSlots(ctx context.Context, q querier, nodeID string, forUpdate bool) ([]apiv1.Slot, error) {
	sql := `SELECT ` + slotColumns + ` FROM node_resource_slots s WHERE s.node_id = $1 ORDER BY s.slot_index`
	if forUpdate {
		sql += ` FOR UPDATE OF s`
	}
	return queryAll(ctx, q, scanSlot, sql, nodeID)
}

// slotRow is the comparable, writable part of a slot (what a slot map declares).
type slotRow struct {
	SlotIndex        int
	GPUModel         string
	PCIAddress       string
	GPUUUID          string
	GPUMemoryMiB     int
	NVMeDevice       string
	NetworkFabric    string
	NetworkDevice    string
	FabricPCIAddress string
	FabricDeviceID   string
	NUMANode         *int
	VCPUCount        *int
	MemoryMiB        *int
	HostCPUs         string // cpuset.Format form, so equal sets compare equal
	MACAddress       string
	PrivateIP        string
	CapacityMetadata map[string]any
	SharingModel     string
	ProfileName      string
	ComputeMilli     int
	MaxClaims        int
	ParentSlotIndex  *int
}

var slotRowFields = map[string]string{
	"GPUModel": "gpu_model", "PCIAddress": "pci_address", "GPUUUID": "gpu_uuid", "GPUMemoryMiB": "gpu_memory_mib",
	"NVMeDevice": "nvme_device", "NetworkFabric": "network_fabric", "NetworkDevice": "network_device",
	"FabricPCIAddress": "fabric_pci_address", "FabricDeviceID": "fabric_device_id", "NUMANode": "numa_node",
	"VCPUCount": "vcpu_count", "MemoryMiB": "memory_mib", "HostCPUs": "host_cpus", "MACAddress": "mac_address", "PrivateIP": "private_ip",
	"CapacityMetadata": "capacity_metadata", "SharingModel": "sharing_model", "ProfileName": "profile_name",
	"ComputeMilli": "compute_milli", "MaxClaims": "max_claims", "ParentSlotIndex": "parent_slot_index",
}

// SpecRow normalises a validated SlotSpec into the stored form (defaults applied).
func SpecRow(sp apiv1.SlotSpec) slotRow {
	r := slotRow{
		SlotIndex: sp.SlotIndex, GPUModel: sp.GPUModel, PCIAddress: sp.PCIAddress, GPUUUID: sp.GPUUUID,
		GPUMemoryMiB: sp.GPUMemoryMiB, NVMeDevice: sp.NVMeDevice, NetworkFabric: sp.NetworkFabric,
		NetworkDevice: sp.NetworkDevice, FabricPCIAddress: sp.FabricPCIAddress, FabricDeviceID: sp.FabricDeviceID,
		NUMANode: sp.NUMANode, VCPUCount: sp.VCPUCount, MemoryMiB: sp.MemoryMiB, MACAddress: sp.MACAddress,
		PrivateIP: sp.PrivateIP, CapacityMetadata: sp.CapacityMetadata, SharingModel: sp.SharingModel,
		ProfileName: sp.ProfileName, ComputeMilli: 1000, MaxClaims: 1, ParentSlotIndex: sp.ParentSlotIndex,
	}
	if cpus, err := cpuset.Parse(sp.HostCPUs); err == nil { // validated before; unparsable stays as given and fails the write
		r.HostCPUs = cpuset.Format(cpus)
	} else {
		r.HostCPUs = sp.HostCPUs
	}
	if r.NetworkFabric == "" {
		r.NetworkFabric = "none"
	}
	if r.SharingModel == "" {
		r.SharingModel = "exclusive_device"
	}
	if sp.ComputeMilli != nil {
		r.ComputeMilli = *sp.ComputeMilli
	}
	if sp.MaxClaims != nil {
		r.MaxClaims = *sp.MaxClaims
	}
	if r.CapacityMetadata == nil {
		r.CapacityMetadata = map[string]any{}
	}
	return r
}

func existingRow(sl apiv1.Slot, indexByID map[string]int) slotRow {
	md := map[string]any{}
	_ = json.Unmarshal(sl.CapacityMetadata, &md)
	r := slotRow{
		SlotIndex: sl.SlotIndex, GPUModel: sl.GPUModel, PCIAddress: sl.PCIAddress, GPUUUID: sl.GPUUUID,
		GPUMemoryMiB: sl.GPUMemoryMiB, NVMeDevice: sl.NVMeDevice, NetworkFabric: sl.NetworkFabric,
		NetworkDevice: sl.NetworkDevice, FabricPCIAddress: sl.FabricPCIAddress, FabricDeviceID: sl.FabricDeviceID,
		NUMANode: sl.NUMANode, VCPUCount: sl.VCPUCount, MemoryMiB: sl.MemoryMiB, HostCPUs: sl.HostCPUs, MACAddress: sl.MACAddress,
		PrivateIP: sl.PrivateIP, CapacityMetadata: md, SharingModel: sl.SharingModel, ProfileName: sl.ProfileName,
		ComputeMilli: sl.ComputeMilli, MaxClaims: sl.MaxClaims,
	}
	if sl.ParentSlotID != "" {
		if idx, ok := indexByID[sl.ParentSlotID]; ok {
			r.ParentSlotIndex = &idx
		}
	}
	return r
}

// diffFields names the declared fields that differ between two rows.
func diffFields(a, b slotRow) []string {
	var out []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := 0; i < va.NumField(); i++ {
		name := va.Type().Field(i).Name
		col, ok := slotRowFields[name]
		if !ok {
			continue
		}
		if !reflect.DeepEqual(normalize(va.Field(i).Interface()), normalize(vb.Field(i).Interface())) {
			out = append(out, col)
		}
	}
	sort.Strings(out)
	return out
}

// normalize makes JSON-ish values comparable (numbers decoded from JSON are float64).
func normalize(v any) any {
	if m, ok := v.(map[string]any); ok {
		b, _ := json.Marshal(m)
		var out any
		_ = json.Unmarshal(b, &out)
		return out
	}
	return v
}

// ApplySlots reconciles a node's slots with a declarative map: creates missing slots,
// updates changed ones, disables slots the map no longer lists. Slots that hold a live
// claim (or are mid-release) cannot be changed: that is a conflict listing them.
// With dryRun nothing is written.
func (t *Tx) ApplySlots(ctx context.Context, nodeID string, specs []apiv1.SlotSpec, dryRun bool) (apiv1.SlotApplyResult, error) {
	res := apiv1.SlotApplyResult{Changes: []apiv1.SlotChange{}}
	// Lock the node row so two concurrent applies serialize, then the slots.
	var nodeName string
	if err := t.tx.QueryRow(ctx, `SELECT name FROM nodes WHERE id = $1 FOR UPDATE`, nodeID).Scan(&nodeName); err != nil {
		return res, translate(err)
	}
	existing, err := listSlots(ctx, t.tx, nodeID, true)
	if err != nil {
		return res, err
	}
	byIndex := map[int]apiv1.Slot{}
	indexByID := map[string]int{}
	for _, sl := range existing {
		byIndex[sl.SlotIndex] = sl
		indexByID[sl.ID] = sl.SlotIndex
	}
	mutable := func(status string) bool {
		return status == "available" || status == "disabled" || status == "cleanup_blocked" || status == "failed"
	}
	declared := map[int]bool{}
	enabledMACs := map[int]string{} // the MACs the node's enabled slots will hold
	var blocked []int
	type write struct {
		row    slotRow
		create bool
	}
	var writes []write
	for _, sp := range specs {
		row := SpecRow(sp)
		declared[row.SlotIndex] = true
		cur, ok := byIndex[row.SlotIndex]
		if !ok || cur.Status != "disabled" {
			enabledMACs[row.SlotIndex] = row.MACAddress
		}
		if !ok {
			res.Changes = append(res.Changes, apiv1.SlotChange{SlotIndex: row.SlotIndex, Action: "create", HostCPUs: row.HostCPUs})
			writes = append(writes, write{row: row, create: true})
			continue
		}
		fields := diffFields(existingRow(cur, indexByID), row)
		if len(fields) == 0 {
			res.Changes = append(res.Changes, apiv1.SlotChange{SlotIndex: row.SlotIndex, Action: "unchanged", HostCPUs: row.HostCPUs})
			continue
		}
		if !mutable(cur.Status) {
			blocked = append(blocked, row.SlotIndex)
		}
		res.Changes = append(res.Changes, apiv1.SlotChange{SlotIndex: row.SlotIndex, Action: "update", Fields: fields, HostCPUs: row.HostCPUs})
		writes = append(writes, write{row: row})
	}
	var disables []int
	for _, sl := range existing {
		if declared[sl.SlotIndex] || sl.Status == "disabled" {
			continue
		}
		if sl.Status != "available" {
			blocked = append(blocked, sl.SlotIndex)
		}
		res.Changes = append(res.Changes, apiv1.SlotChange{SlotIndex: sl.SlotIndex, Action: "disable"})
		disables = append(disables, sl.SlotIndex)
	}
	sort.Slice(res.Changes, func(i, j int) bool { return res.Changes[i].SlotIndex < res.Changes[j].SlotIndex })
	if len(blocked) > 0 {
		sort.Ints(blocked)
		return res, &DBError{Kind: ErrConflict, Detail: fmt.Sprintf("slots %v are in use (live claim or cleanup in progress); release them before changing the map", blocked)}
	}
	if err := t.checkMACs(ctx, nodeID, nodeName, enabledMACs); err != nil {
		return res, err
	}
	if dryRun {
		return res, nil
	}
	// The identity checks wait for the whole map (a map may swap identities between its
	// slots), then run before this returns, so a conflict is this call's error.
	macs := make([]string, 0, len(enabledMACs))
	for _, m := range enabledMACs {
		macs = append(macs, m)
	}
	if err := t.lockMACs(ctx, macs); err != nil {
		return res, err
	}
	if _, err := t.tx.Exec(ctx, `SET CONSTRAINTS `+identityTriggers+` DEFERRED`); err != nil {
		return res, translate(err)
	}
	// Creates and updates first without parents, then parent links (parents may be new).
	for _, w := range writes {
		md, err := json.Marshal(w.row.CapacityMetadata)
		if err != nil {
			return res, err
		}
		r := w.row
		cpus, err := cpuset.Parse(r.HostCPUs)
		if err != nil {
			return res, &DBError{Kind: ErrInvalid, Detail: fmt.Sprintf("slot %d: host_cpus: %v", r.SlotIndex, err)}
		}
		if cpus == nil {
			cpus = []int{}
		}
		args := []any{nodeID, r.SlotIndex, r.GPUModel, r.PCIAddress, r.GPUUUID, r.GPUMemoryMiB, r.NVMeDevice,
			r.NetworkFabric, r.NetworkDevice, r.FabricPCIAddress, r.FabricDeviceID, r.NUMANode, r.VCPUCount,
			r.MemoryMiB, r.MACAddress, nullIfEmpty(r.PrivateIP), md, r.SharingModel, r.ProfileName,
			r.ComputeMilli, r.MaxClaims, cpus}
		if w.create {
			_, err = t.tx.Exec(ctx, `INSERT INTO node_resource_slots (node_id, slot_index, gpu_model, pci_address,
				gpu_uuid, gpu_memory_mib, nvme_device, network_fabric, network_device, fabric_pci_address,
				fabric_device_id, numa_node, vcpu_count, memory_mib, mac_address, private_ip, capacity_metadata,
				sharing_model, profile_name, compute_milli, max_claims, host_cpus)
				VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22)`, args...)
		} else {
			_, err = t.tx.Exec(ctx, `UPDATE node_resource_slots SET gpu_model=$3, pci_address=$4, gpu_uuid=$5,
				gpu_memory_mib=$6, nvme_device=$7, network_fabric=$8, network_device=$9, fabric_pci_address=$10,
				fabric_device_id=$11, numa_node=$12, vcpu_count=$13, memory_mib=$14, mac_address=$15,
				private_ip=$16, capacity_metadata=$17, sharing_model=$18, profile_name=$19, compute_milli=$20,
				max_claims=$21, host_cpus=$22 WHERE node_id=$1 AND slot_index=$2`, args...)
		}
		if err != nil {
			return res, translate(err)
		}
	}
	for _, w := range writes {
		var parent any
		if w.row.ParentSlotIndex != nil {
			parent = *w.row.ParentSlotIndex
		}
		_, err := t.tx.Exec(ctx, `UPDATE node_resource_slots s SET parent_slot_id =
				(SELECT p.id FROM node_resource_slots p WHERE p.node_id = $1 AND p.slot_index = $3)
			WHERE s.node_id = $1 AND s.slot_index = $2
			  AND s.parent_slot_id IS DISTINCT FROM (SELECT p.id FROM node_resource_slots p WHERE p.node_id = $1 AND p.slot_index = $3)`,
			nodeID, w.row.SlotIndex, parent)
		if err != nil {
			return res, translate(err)
		}
	}
	for _, idx := range disables {
		if _, err := t.tx.Exec(ctx, `UPDATE node_resource_slots SET status = 'disabled', status_reason = 'removed from slot map'
			WHERE node_id = $1 AND slot_index = $2`, nodeID, idx); err != nil {
			return res, translate(err)
		}
	}
	if _, err := t.tx.Exec(ctx, `SET CONSTRAINTS `+identityTriggers+` IMMEDIATE`); err != nil {
		return res, translate(err)
	}
	if err := t.recountAvailable(ctx, nodeID); err != nil {
		return res, err
	}
	res.Applied = true
	return res, nil
}

// recountAvailable makes the node's best-fit hints (nodes.available_slots, group_available,
// slice_allocations) exact in this transaction. Operator changes to a node's slots (a slot map applied, a slot enabled or
// disabled) are rare, so they recount at once instead of leaving the change out of placement
// windows until the next refresh (up to 250 ms, in which a request would be placed as if the
// capacity were not there). Reservations and releases leave it to the refresh: they would
// queue behind each other on the node row.
func (t *Tx) recountAvailable(ctx context.Context, nodeID string) error {
	_, err := t.tx.Exec(ctx, `UPDATE nodes n SET (available_slots, group_available, slice_allocations) = (SELECT c.free, c.grp, c.allocs FROM `+capacityOfN+` c) WHERE n.id = $1`, nodeID)
	return translate(err)
}

// SetSlotEnabled disables an available (or cleanup-blocked/failed) slot, or re-enables a disabled one.
//
// Enabling re-checks the slot's device identities (migration 017): a GPU, NVMe, VF or IP that
// another enabled slot of the node took meanwhile, or a MAC another slot of the fleet took, is a
// conflict naming that slot. The node row is locked first, as ApplySlots and the identity
// check lock it, so the two never wait on each other in opposite orders.
func (t *Tx) SetSlotEnabled(ctx context.Context, nodeID string, index int, enabled bool, reason string) (apiv1.Slot, error) {
	if _, err := t.tx.Exec(ctx, `SELECT 1 FROM nodes WHERE id = $1 FOR NO KEY UPDATE`, nodeID); err != nil {
		return apiv1.Slot{}, translate(err)
	}
	var status string
	var needsWipe bool
	err := t.tx.QueryRow(ctx, `SELECT status, needs_wipe FROM node_resource_slots WHERE node_id = $1 AND slot_index = $2 FOR UPDATE`,
		nodeID, index).Scan(&status, &needsWipe)
	if err != nil {
		return apiv1.Slot{}, translate(err)
	}
	target := "disabled"
	if enabled {
		target = "available"
	}
	switch {
	case status == target:
		// idempotent
	case enabled && status != "disabled":
		return apiv1.Slot{}, &DBError{Kind: ErrConflict, Detail: fmt.Sprintf("slot %d is %s; only a disabled slot can be enabled (a cleanup-blocked slot needs a verified wipe)", index, status)}
	case enabled && needsWipe:
		// The database refuses it too (migration 015); this says what to do in our words.
		return apiv1.Slot{}, &DBError{Kind: ErrConflict, Constraint: WipeGate, Detail: fmt.Sprintf("slot %d has held a claim since its last verified wipe "+
			"and cannot be enabled until its disk is wiped and verified: run `gpuaasctl slots wipe NODE %d --apply --wait`, then enable it", index, index)}
	case !enabled && status != "available" && status != "cleanup_blocked" && status != "failed":
		return apiv1.Slot{}, &DBError{Kind: ErrConflict, Detail: fmt.Sprintf("slot %d is %s (in use); release it first", index, status)}
	default:
		if _, err := t.tx.Exec(ctx, `UPDATE node_resource_slots SET status = $3, status_reason = $4
			WHERE node_id = $1 AND slot_index = $2`, nodeID, index, target, reason); err != nil {
			return apiv1.Slot{}, translate(err)
		}
		if err := t.recountAvailable(ctx, nodeID); err != nil {
			return apiv1.Slot{}, err
		}
	}
	var sl apiv1.Slot
	err = scanSlot(t.tx.QueryRow(ctx, `SELECT `+slotColumns+` FROM node_resource_slots s WHERE s.node_id = $1 AND s.slot_index = $2`, nodeID, index), &sl)
	return sl, translate(err)
}
