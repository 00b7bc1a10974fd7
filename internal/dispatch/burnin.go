package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// BurnInAllocationID names a slot's burn-in validation VM on its host (its domain, lease,
// DHCP reservation and telemetry token): one per slot, the same on every retry, so a retried
// task adopts or replaces the VM an earlier attempt left.
func BurnInAllocationID(slotID string) string { return "validate-" + slotID }

// burnInPlan is the validation VM of a slot: the slot's own bundle (GPU, fabric VF, disk,
// MAC and IP, CPUs), the one-GPU profile of its SKU and the image the SKU's slices boot by
// default, as a one-slot slice would be provisioned.
func (d *Dispatcher) burnInPlan(ctx context.Context, slot *apiv1.Slot) (*task.VMProvision, error) {
	node, err := d.st.GetNode(ctx, slot.NodeID)
	if err != nil {
		return nil, err
	}
	if node.SliceSKU == "" {
		return nil, fmt.Errorf("node %s sells no slices: no burn-in plan", node.Name)
	}
	sku, err := d.st.GetSKU(ctx, node.SliceSKU)
	if err != nil {
		return nil, err
	}
	img, err := d.st.ResolveSliceImage(ctx, sku.SKU, "")
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("SKU %s has no viable image to boot its burn-in validation VM", sku.SKU)
	}
	if err != nil {
		return nil, err
	}
	prof, err := alloc.ResolveProfile(sku, 1, "")
	if err != nil {
		return nil, err
	}
	var md struct {
		VF     string `json:"fabric_vf_pci_address"`
		Wipe   string `json:"destructive_wipe_policy"`
		DiskID string `json:"disk_identity"`
	}
	_ = json.Unmarshal(slot.CapacityMetadata, &md)
	b := task.Bundle{SlotID: slot.ID, SlotIndex: slot.SlotIndex, GPUPCI: slot.PCIAddress, FabricParentPCI: slot.FabricPCIAddress,
		FabricVFPCI: md.VF, NVMeDevice: slot.NVMeDevice, NUMANode: slot.NUMANode, MACAddress: slot.MACAddress, PrivateIP: slot.PrivateIP,
		WipePolicy: md.Wipe, DiskIdentity: md.DiskID, HostCPUs: slot.HostCPUs}
	if slot.VCPUCount != nil {
		b.VCPUCount = *slot.VCPUCount
	}
	if slot.MemoryMiB != nil {
		b.MemoryMiB = *slot.MemoryMiB
	}
	plan := &task.VMProvision{AllocationID: BurnInAllocationID(slot.ID), Bundles: []task.Bundle{b}, Validation: true}
	if err := convert(prof, &plan.Profile); err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	if err := convert(img, &plan.Image); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	if img.SignatureRequired {
		plan.ImageKeys = append([]imagesig.Key(nil), d.cfg.ImageKeys...)
	}
	return plan, nil
}

// convert copies a value into the task's form of it through their common JSON (the same
// conversion provisioning makes from an allocation's snapshots).
func convert(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, to)
}
