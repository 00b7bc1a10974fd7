package api_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
)

// A create and a release answer from what their own transaction wrote and returned, not from
// a read after it. Each answer, as sent, must be byte for byte what GET sends right after: for
// a slice (with its provisioning task, queued by the dispatcher inside the create) and for a
// baremetal node, to a tenant and to an admin, with and without an Idempotency-Key; a replayed
// create answers what the first did, and a repeated release what the first release did.
func TestCreateAndReleaseAnswerWhatGetSends(t *testing.T) {
	b := setup(t)
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	dispatch.New(b.st, b.svc, key, nil, dispatch.Config{}) // the create queues its task itself (not run: tasks stay queued)
	b.world()
	same := func(what, token string, answer []byte) {
		t.Helper()
		var a apiv1.Allocation
		if err := json.Unmarshal(answer, &a); err != nil || a.ID == "" {
			t.Fatalf("%s answered %s", what, answer)
		}
		code, read := b.do("GET", "/api/v1/allocations/"+a.ID, token, nil)
		if code != 200 || !bytes.Equal(answer, read) {
			t.Fatalf("%s answered\n%s\nGET sends (%d)\n%s", what, answer, code, read)
		}
	}
	for _, c := range []struct {
		sku  string
		gpus int
	}{{"h200-sxm-slice", 2}, {"h200-sxm-baremetal-8g", 8}} {
		for _, who := range []string{"tenant", "admin"} {
			for _, idem := range []string{"", "k-" + c.sku + "-" + who} {
				what := c.sku + " by " + who
				if idem != "" {
					what += " with an Idempotency-Key"
				}
				token, req := b.tenant, apiv1.AllocationCreate{SKU: c.sku, GPUs: c.gpus}
				if who == "admin" {
					token, req.TenantID = b.admin, b.tenID
				}
				var hdr []string
				if idem != "" {
					hdr = []string{"Idempotency-Key", idem}
				}
				code, created := b.do("POST", "/api/v1/allocations", token, req, hdr...)
				if code != 201 {
					t.Fatalf("%s: create = %d %s", what, code, created)
				}
				same(what+": create", token, created)
				var a apiv1.Allocation
				_ = json.Unmarshal(created, &a)
				if c.gpus == 2 && (len(a.Tasks) != 1 || a.Tasks[0].Status != "queued") {
					t.Fatalf("%s: create answered tasks %+v, want the queued provisioning task", what, a.Tasks)
				}
				if idem != "" {
					code, replayed := b.do("POST", "/api/v1/allocations", token, req, hdr...)
					if code != 200 || !bytes.Equal(replayed, created) {
						t.Fatalf("%s: replay = %d\n%s\nthe first answered\n%s", what, code, replayed, created)
					}
				}
				code, released := b.do("POST", "/api/v1/allocations/"+a.ID+"/release", token, nil)
				if code != 200 {
					t.Fatalf("%s: release = %d %s", what, code, released)
				}
				same(what+": release", token, released)
				var r apiv1.Allocation
				_ = json.Unmarshal(released, &r)
				if r.Status != "released" || r.ReleasedAt == nil || len(r.Slots) > 0 && r.Slots[0].Status != "released" ||
					c.gpus == 2 && (len(r.Tasks) != 1 || r.Tasks[0].Status != "cancelled") {
					t.Fatalf("%s: release answered %s", what, released)
				}
				code, again := b.do("POST", "/api/v1/allocations/"+a.ID+"/release", token, nil)
				if code != 200 || !bytes.Equal(again, released) {
					t.Fatalf("%s: a second release = %d\n%s\nthe first answered\n%s", what, code, again, released)
				}
			}
		}
	}
	// A release with a problem report quarantines the slots and records a health event for
	// each, in the release's transaction: its answer shows them as GET does.
	code, created := b.do("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1})
	if code != 201 {
		t.Fatalf("create = %d %s", code, created)
	}
	var a apiv1.Allocation
	_ = json.Unmarshal(created, &a)
	code, reported := b.do("POST", "/api/v1/allocations/"+a.ID+"/release", b.tenant, map[string]string{"report": "GPU fell off the bus"})
	if code != 200 {
		t.Fatalf("release with a report = %d %s", code, reported)
	}
	var r apiv1.Allocation
	_ = json.Unmarshal(reported, &r)
	if r.Status != "released" || len(r.HealthEvents) != 1 {
		t.Fatalf("release with a report answered %s", reported)
	}
	same("release with a report", b.tenant, reported)
}
