package dispatch_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// A SKU whose policy is burn-in validates a slot with a signed task carrying the slot's own
// validation VM: its one bundle (GPU, VF, disk, MAC/IP, CPUs), the SKU's one-GPU profile and
// its default image, the plan marked as a validation VM. A quick SKU's task carries none. With no viable image for the SKU there is
// no burn-in plan, and no task.
func TestBurnInValidationCarriesTheSlotsVMPlan(t *testing.T) {
	w := setup(t, dispatch.Config{})
	slots, err := w.st.ListSlots(w.ctx, w.node.ID)
	if err != nil {
		t.Fatal(err)
	}
	slot := slots[3]
	policy := func(p string) {
		t.Helper()
		if err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
			_, err := tx.PatchSKU(w.ctx, "h200-sxm-slice", apiv1.SKUPatch{ValidationPolicy: &p})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	policy("quick")
	if p, err := w.d.ValidationPayload(w.ctx, &slot); err != nil || p.Level != "quick" || p.BurnIn != nil {
		t.Fatalf("quick SKU: %+v %v", p, err)
	}
	policy("burn-in")
	p, err := w.d.ValidationPayload(w.ctx, &slot)
	if err != nil {
		t.Fatal(err)
	}
	// As the host decodes it.
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	v := &task.SlotValidate{}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
	plan := v.BurnIn
	if v.Level != "burn-in" || plan == nil || !plan.Validation || plan.AllocationID != dispatch.BurnInAllocationID(slot.ID) || len(plan.Bundles) != 1 {
		t.Fatalf("burn-in task = %+v", v)
	}
	b := plan.Bundles[0]
	if b.SlotID != slot.ID || b.GPUPCI != slot.PCIAddress || b.FabricVFPCI != "0000:5d:00.2" || b.NVMeDevice != slot.NVMeDevice ||
		b.MACAddress != slot.MACAddress || b.PrivateIP != slot.PrivateIP || b.HostCPUs != slot.HostCPUs || b.VCPUCount != 24 {
		t.Fatalf("bundle = %+v, slot %+v", b, slot)
	}
	if plan.Profile.GPUCount != 1 || plan.Image.Slug != "img" || plan.Image.DigestSHA256 != strings.Repeat("cd", 32) {
		t.Fatalf("profile %+v image %+v", plan.Profile, plan.Image)
	}
	if err := w.st.InTx(w.ctx, func(tx *store.Tx) error { return tx.RetireImage(w.ctx, "img") }); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.ValidationPayload(w.ctx, &slot); err == nil || !strings.Contains(err.Error(), "no viable image") {
		t.Fatalf("burn-in without an image: %v", err)
	}
}
