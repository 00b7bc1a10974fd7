package api_test

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Operators quarantine and clear slots over the API: each change is audited, a clear without
// a validation is a 409 in our words (no SQL), the gauge counts quarantined slots, and a
// tenant's release with a report quarantines its slots and shows the report on its
// allocation. Bad input is a 400.
func TestSlotHealthOverTheAPI(t *testing.T) {
	b := setup(t)
	b.world()
	var ev apiv1.HealthEvent
	b.must("POST", "/api/v1/admin/nodes/n1/slots/6/quarantine", b.admin, apiv1.SlotHealthChange{Reason: "riser reseated, watch it"}, 200, &ev)
	if ev.HealthBefore != "healthy" || ev.HealthAfter != "quarantined" {
		t.Fatalf("quarantine: %+v", ev)
	}
	code, body := b.do("POST", "/api/v1/admin/nodes/n1/slots/6/clear", b.admin, apiv1.SlotHealthChange{Reason: "fine now"})
	msg := apiError(t, body).Message
	if code != 409 || !strings.Contains(msg, "no passed validation") || strings.Contains(msg, "SQLSTATE") || strings.Contains(msg, "slot_health") {
		t.Fatalf("clear without validation = %d %s", code, body)
	}
	for _, bad := range []struct {
		path string
		body any
	}{
		{"/api/v1/admin/nodes/n1/slots/6/quarantine", apiv1.SlotHealthChange{}},
		{"/api/v1/admin/nodes/n1/slots/6/quarantine", map[string]any{"reason": "x", "extra": 1}},
		{"/api/v1/admin/nodes/n1/slots/6/quarantine", apiv1.SlotHealthChange{Reason: strings.Repeat("r", 501)}},
		{"/api/v1/admin/nodes/n1/slots/x/quarantine", apiv1.SlotHealthChange{Reason: "x"}},
	} {
		if code, body := b.do("POST", bad.path, b.admin, bad.body); code != 400 {
			t.Fatalf("%s %v = %d %s", bad.path, bad.body, code, body)
		}
	}
	if code, _ := b.do("POST", "/api/v1/admin/nodes/n1/slots/42/quarantine", b.admin, apiv1.SlotHealthChange{Reason: "x"}); code != 404 {
		t.Fatalf("unknown slot = %d", code)
	}
	var fleet apiv1.List[apiv1.NodeHealth]
	b.must("GET", "/api/v1/admin/health", b.admin, nil, 200, &fleet)
	if len(fleet.Items) != 1 || fleet.Items[0].Quarantined != 1 || fleet.Items[0].Healthy != 7 {
		t.Fatalf("fleet %+v", fleet.Items)
	}
	var sh apiv1.SlotHealth
	b.must("GET", "/api/v1/admin/nodes/n1/slots/6/health", b.admin, nil, 200, &sh)
	if sh.Health != "quarantined" || len(sh.Events) != 1 || sh.Events[0].Actor == "" {
		t.Fatalf("slot health %+v", sh)
	}
	var audit apiv1.List[apiv1.AuditEntry]
	b.must("GET", "/api/v1/admin/audit?action=slot.health.quarantine", b.admin, nil, 200, &audit)
	if len(audit.Items) != 1 {
		t.Fatalf("audit %+v", audit.Items)
	}
	_, metrics := b.do("GET", "/metrics", "", nil)
	if !strings.Contains(string(metrics), `gpuaas_slots_quarantined{sku="h200-sxm-slice"} 1`) {
		t.Fatalf("metrics lack the quarantined gauge:\n%s", grepLines(string(metrics), "quarantined"))
	}

	var a apiv1.Allocation
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &a)
	if code, body := b.do("POST", "/api/v1/allocations/"+a.ID+"/release", b.tenant, map[string]string{"report": "bad\x01"}); code != 400 {
		t.Fatalf("control characters in a report = %d %s", code, body)
	}
	if code, _ := b.do("POST", "/api/v1/allocations/"+a.ID+"/release", b.other, apiv1.ReleaseRequest{Report: "not mine"}); code != 404 {
		t.Fatalf("another tenant's report = %d", code)
	}
	var rel apiv1.Allocation
	b.must("POST", "/api/v1/allocations/"+a.ID+"/release", b.tenant, apiv1.ReleaseRequest{Report: "GPU 0 Xid 79 during training"}, 200, &rel)
	b.must("GET", "/api/v1/allocations/"+a.ID, b.tenant, nil, 200, &rel)
	if len(rel.HealthEvents) != 1 || !strings.Contains(rel.HealthEvents[0].Reason, "Xid 79 during training") || rel.HealthEvents[0].NodeName != "" {
		t.Fatalf("the tenant's allocation shows %+v", rel.HealthEvents)
	}
	_, metrics = b.do("GET", "/metrics", "", nil)
	if !strings.Contains(string(metrics), `gpuaas_slots_quarantined{sku="h200-sxm-slice"} 2`) {
		t.Fatalf("the reported slot is quarantined:\n%s", grepLines(string(metrics), "quarantined"))
	}
}

func grepLines(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
