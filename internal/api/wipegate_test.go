package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
)

// The admin API cannot put an unwiped disk back on sale: a slot that held a claim and was
// blocked is refused at enable after disable (409, in our words, saying how to wipe it), the
// slot stays disabled and the refusal writes no audit row.
func TestEnableRefusesASlotThatNeedsAWipe(t *testing.T) {
	b := setup(t)
	b.world()
	ctx := context.Background()
	var a apiv1.Allocation
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &a)
	svc := alloc.New(b.st, alloc.Config{})
	if err := svc.MarkProvisioning(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := svc.MarkFailed(ctx, a.ID, "image_write_convert: qemu-img exited 1"); err != nil {
		t.Fatal(err)
	}
	if err := svc.CleanupFailed(ctx, a.ID, nil); err != nil { // the host proved nothing
		t.Fatal(err)
	}
	var slots apiv1.List[apiv1.Slot]
	b.must("GET", "/api/v1/admin/nodes/n1/slots", b.admin, nil, 200, &slots)
	if s := slots.Items[0]; s.Status != "cleanup_blocked" || !s.NeedsWipe {
		t.Fatalf("slot 0 = %s (needs_wipe %v), want cleanup_blocked needing a wipe", s.Status, s.NeedsWipe)
	}
	b.must("POST", "/api/v1/admin/nodes/n1/slots/0/disable", b.admin, nil, 200, nil)
	code, body := b.do("POST", "/api/v1/admin/nodes/n1/slots/0/enable", b.admin, nil)
	msg := apiError(t, body).Message
	if code != 409 || !strings.Contains(msg, "verified wipe") || !strings.Contains(msg, "gpuaasctl slots wipe") ||
		strings.Contains(msg, "SQLSTATE") || strings.Contains(msg, "ERROR:") {
		t.Fatalf("enable of an unwiped slot = %d %s", code, body)
	}
	b.must("GET", "/api/v1/admin/nodes/n1/slots", b.admin, nil, 200, &slots)
	if s := slots.Items[0]; s.Status != "disabled" || !s.NeedsWipe {
		t.Fatalf("slot 0 after the refused enable = %s (needs_wipe %v)", s.Status, s.NeedsWipe)
	}
	var entries apiv1.List[apiv1.AuditEntry]
	b.must("GET", "/api/v1/admin/audit?action=slot.enable", b.admin, nil, 200, &entries)
	if len(entries.Items) != 0 {
		t.Fatalf("a refused enable was audited: %+v", entries.Items)
	}
}

// slots apply refuses a wipe policy hostd does not implement, before anything is written.
func TestSlotApplyRefusesAnUnknownWipePolicy(t *testing.T) {
	b := setup(t)
	b.world()
	m := fixtures.H200SlotMap(1)
	m[3].CapacityMetadata["destructive_wipe_policy"] = "shred_35_passes"
	code, body := b.do("PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: m})
	if code != 400 || !strings.Contains(apiError(t, body).Message, `slot 3: capacity_metadata.unknown destructive_wipe_policy "shred_35_passes"`) {
		t.Fatalf("apply with an unknown wipe policy = %d %s", code, body)
	}
	m = fixtures.H200SlotMap(1)
	m[2].CapacityMetadata["disk_identity"] = "serial S64ANS0T512345K; rm -rf /"
	if code, body := b.do("PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: m}); code != 400 || !strings.Contains(string(body), "disk_identity") {
		t.Fatalf("apply with a malformed disk identity = %d %s", code, body)
	}
	m = fixtures.H200SlotMap(1)
	m[1].CapacityMetadata["destructive_wipe_policy"] = "nvme_sanitize_verify"
	m[1].CapacityMetadata["disk_identity"] = "serial:S64ANS0T512345K"
	b.must("PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: m}, 200, nil)
}
