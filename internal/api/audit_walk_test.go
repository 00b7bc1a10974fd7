package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/topology"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

// Mutations that are not an actor's privileged decision, and why.
var notAudited = map[string]string{
	"POST /api/v1/placement/explain":         "a dry run: reserves and changes nothing",
	"POST /api/v1/agent/heartbeat":           "a host reporting its own facts (recorded on the node)",
	"POST /api/v1/agent/tasks/{id}/result":   "a host reporting on a task the controller issued (recorded in node_tasks; the allocation's own transitions are audited by the lifecycle)",
	"POST /api/v1/agent/tasks/{id}/progress": "a host reporting live phases of its own task",
	"POST /api/v1/agent/health":              "a host reporting its own device readings (each kept in the slot's health history, the host as its actor)",
}

// auditStep is one successful privileged call and the audit row it must write.
type auditStep struct {
	route  string // "METHOD /pattern" of the table
	path   string
	body   any
	status int
	action string
	target func(body []byte) string // the row's target_id
	bearer string                   // default: the admin token
	client *http.Client             // default: no client certificate
	actor  string                   // a substring of the row's actor (default: the admin token's name)
}

func jsonID(body []byte) string {
	var v struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &v)
	return v.ID
}

func fixedID(id string) func([]byte) string { return func([]byte) string { return id } }

// TestEveryPrivilegedMutationIsAudited walks every mutation route of the table (from the
// served OpenAPI document): each successful call writes exactly one audit row naming the
// actor, the action and the target, in the same request (request id). A new mutation route
// must be added here or to notAudited with a reason.
func TestEveryPrivilegedMutationIsAudited(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{})
	w.populate()
	ctx := context.Background()
	z := w.nodeZ.ID

	// A cleanup_blocked slot on node Z (released without wipe proof) for the repair wipe.
	a, _, err := w.svc.Create(ctx, alloc.Actor{Role: "tenant", TenantID: w.tenAID}, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.svc.MarkProvisioning(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.svc.MarkActive(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.Release(ctx, alloc.Actor{Role: "admin"}, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.svc.CompleteRelease(ctx, a.ID, nil); err != nil {
		t.Fatal(err)
	}
	var blocked apiv1.Slot
	var slots apiv1.List[apiv1.Slot]
	w.must("GET", "/api/v1/admin/nodes/"+z+"/slots", w.admin, nil, 200, &slots)
	for _, s := range slots.Items {
		if s.Status == "cleanup_blocked" {
			blocked = s
		}
	}
	if blocked.ID == "" {
		t.Fatalf("no cleanup_blocked slot after a release without proof: %+v", slots.Items)
	}
	// Slot 4 of node Z degraded (a clear of a degraded slot needs no validation); slot 5 is
	// quarantined and a free slot (chosen after the setup below has taken its slots) is
	// validated by the walk.
	var slot4, slot5 string
	for _, s := range slots.Items {
		switch s.SlotIndex {
		case 4:
			slot4 = s.ID
		case 5:
			slot5 = s.ID
		}
	}
	if err := w.st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.RecordHealthEvent(ctx, store.HealthEventRecord{SlotID: slot4, NodeID: z, Source: "pcie", Signal: "pcie:link_downtrained",
			Action: "degrade", Reason: "link width x8 of x16", Actor: "test"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	active := w.activeAllocation()
	// Two pending images whose smoke tests on node Z passed (their validation allocations
	// driven to active as a host's result would): one to activate and make the default, one
	// (activated here) to canary, promote and roll back.
	for _, slug := range []string{"walk-a", "walk-b"} {
		im := testImage(slug)
		im.Active = false
		w.must("POST", "/api/v1/admin/os-images", w.admin, im, 201, nil)
		st, err := w.svc.StartSmokeTest(ctx, alloc.Actor{Role: "admin", Name: "setup"}, slug, "node-z")
		if err != nil {
			t.Fatal(err)
		}
		if err := w.svc.MarkProvisioning(ctx, st.AllocationID); err != nil {
			t.Fatal(err)
		}
		if err := w.svc.MarkActive(ctx, st.AllocationID); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.st.InTx(ctx, func(tx *store.Tx) error { _, err := tx.ActivateImage(ctx, "walk-b"); return err }); err != nil {
		t.Fatal(err)
	}
	var slot3 string
	slot3Index := -1
	zSlots, err := w.st.ListSlots(ctx, z)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range zSlots {
		if s.Status == "available" && s.SlotIndex != 4 && s.SlotIndex != 5 && s.SlotIndex != 7 && s.ID != blocked.ID {
			slot3, slot3Index = s.ID, s.SlotIndex
			break
		}
	}
	if slot3 == "" {
		t.Fatal("no free slot on node Z to validate")
	}
	changed := fixtures.H200SlotMap(1)
	changed[6].GPUModel = "NVIDIA H200 NVL"

	var walkNode apiv1.Node
	var walkToken apiv1.Token
	var walkHook apiv1.Webhook
	var walkNodeClient *http.Client
	var createdAlloc, createdReservation string
	steps := []auditStep{
		{route: "POST /api/v1/admin/tenants", path: "/api/v1/admin/tenants", body: map[string]string{"name": "walk"}, status: 201, action: "tenant.create", target: jsonID},
		{route: "POST /api/v1/admin/tokens", path: "/api/v1/admin/tokens", body: apiv1.TokenCreate{Name: "walk", Role: "tenant", TenantID: w.tenBID}, status: 201, action: "token.create",
			target: func(b []byte) string { _ = json.Unmarshal(b, &walkToken); return walkToken.ID }},
		{route: "POST /api/v1/admin/tokens/{id}/revoke", path: "/api/v1/admin/tokens/{walkToken}/revoke", status: 200, action: "token.revoke", target: func([]byte) string { return walkToken.ID }},
		{route: "POST /api/v1/admin/nodes", path: "/api/v1/admin/nodes", body: apiv1.NodeCreate{Name: "node-walk", Region: "lab"}, status: 201, action: "node.create",
			target: func(b []byte) string { _ = json.Unmarshal(b, &walkNode); return walkNode.ID }},
		{route: "POST /api/v1/agent/enroll", path: "/api/v1/agent/enroll", body: "{walkEnroll}", status: 201, action: "node.enroll",
			target: func([]byte) string { return walkNode.ID }, actor: "node:"},
		{route: "POST /api/v1/agent/renew", path: "/api/v1/agent/renew", body: "{walkRenew}", status: 201, action: "node.renew",
			target: func([]byte) string { return walkNode.ID }, actor: "node:"},
		{route: "POST /api/v1/admin/nodes/{id}/bootstrap-token", path: "/api/v1/admin/nodes/node-walk/bootstrap-token", status: 201, action: "node.bootstrap_token", target: func([]byte) string { return walkNode.ID }},
		{route: "POST /api/v1/admin/nodes/{id}/revoke", path: "/api/v1/admin/nodes/node-walk/revoke", status: 200, action: "node.revoke", target: func([]byte) string { return walkNode.ID }},
		{route: "POST /api/v1/admin/nodes/{id}/drain", path: "/api/v1/admin/nodes/" + z + "/drain", status: 200, action: "node.drain", target: fixedID(z)},
		{route: "POST /api/v1/webhooks", path: "/api/v1/webhooks", body: apiv1.WebhookCreate{URL: "https://hooks.example.com/walk", TenantID: w.tenBID}, status: 201, action: "webhook.create",
			target: func(b []byte) string { _ = json.Unmarshal(b, &walkHook); return walkHook.ID }},
		{route: "DELETE /api/v1/webhooks/{id}", path: "/api/v1/webhooks/{walkHook}", status: 200, action: "webhook.delete", target: func([]byte) string { return walkHook.ID }},
		{route: "POST /api/v1/admin/nodes/{id}/undrain", path: "/api/v1/admin/nodes/" + z + "/undrain", status: 200, action: "node.undrain", target: fixedID(z)},
		{route: "PUT /api/v1/admin/nodes/{id}/slots", path: "/api/v1/admin/nodes/" + z + "/slots", body: apiv1.SlotApply{Slots: changed}, status: 200, action: "node.slots.apply", target: fixedID(z)},
		{route: "POST /api/v1/admin/nodes/{id}/slots/{index}/disable", path: "/api/v1/admin/nodes/" + z + "/slots/7/disable", status: 200, action: "slot.disable", target: jsonID},
		{route: "POST /api/v1/admin/nodes/{id}/slots/{index}/enable", path: "/api/v1/admin/nodes/" + z + "/slots/7/enable", status: 200, action: "slot.enable", target: jsonID},
		{route: "POST /api/v1/admin/nodes/{id}/slots/{index}/quarantine", path: "/api/v1/admin/nodes/" + z + "/slots/5/quarantine",
			body: apiv1.SlotHealthChange{Reason: "walk"}, status: 200, action: "slot.health.quarantine", target: fixedID(slot5)},
		{route: "POST /api/v1/admin/nodes/{id}/slots/{index}/clear", path: "/api/v1/admin/nodes/" + z + "/slots/4/clear",
			body: apiv1.SlotHealthChange{Reason: "walk"}, status: 200, action: "slot.health.clear", target: fixedID(slot4)},
		{route: "POST /api/v1/admin/nodes/{id}/slots/{index}/validate", path: fmt.Sprintf("/api/v1/admin/nodes/%s/slots/%d/validate", z, slot3Index),
			status: 202, action: "slot.validate_requested", target: fixedID(slot3)},
		{route: "POST /api/v1/admin/skus", path: "/api/v1/admin/skus", body: apiv1.SKU{SKU: "b200-bm", Vendor: "NVIDIA", DisplayName: "B200 node", CapacityShape: "baremetal",
			GPUsTotal: 8, AllowedGPUCounts: []int{8}}, status: 201, action: "sku.create", target: fixedID("b200-bm")},
		{route: "PATCH /api/v1/admin/skus/{sku}", path: "/api/v1/admin/skus/b200-bm", body: apiv1.SKUPatch{DisplayName: refTo("B200")}, status: 200, action: "sku.patch", target: fixedID("b200-bm")},
		{route: "POST /api/v1/admin/os-images", path: "/api/v1/admin/os-images", body: testImage("walk-img"), status: 201, action: "os_image.create", target: jsonID},
		{route: "PATCH /api/v1/admin/os-images/{id}", path: "/api/v1/admin/os-images/walk-img", body: apiv1.OSImagePatch{DisplayName: refTo("walk")}, status: 200, action: "os_image.patch", target: jsonID},
		{route: "DELETE /api/v1/admin/os-images/{id}", path: "/api/v1/admin/os-images/walk-img", status: 200, action: "os_image.retire", target: jsonID},
		{route: "POST /api/v1/admin/nodes/{id}/slice-topology/discovery", path: "/api/v1/admin/nodes/" + w.nodeX.ID + "/slice-topology/discovery", status: 202, action: "node.topology_discover", target: fixedID(w.nodeX.ID)},
		{route: "POST /api/v1/admin/nodes/{id}/slots/approve", path: "/api/v1/admin/nodes/" + w.nodeX.ID + "/slots/approve", body: "{discovered}", status: 200, action: "node.slots.approve", target: fixedID(w.nodeX.ID)},
		{route: "POST /api/v1/admin/nodes/{id}/storage-transition", path: "/api/v1/admin/nodes/" + z + "/storage-transition", body: apiv1.StorageTransitionRequest{Devices: []string{"/dev/disk/by-id/nvme-x"}},
			status: 202, action: "node.storage_transition", target: fixedID(z)},
		{route: "POST /api/v1/admin/nodes/{id}/slots/{index}/wipe", path: fmt.Sprintf("/api/v1/admin/nodes/%s/slots/%d/wipe", z, blocked.SlotIndex), body: map[string]bool{"apply": false},
			status: 202, action: "slot.wipe_requested", target: fixedID(blocked.ID)},
		{route: "POST /api/v1/admin/nodes/{id}/reconcile", path: "/api/v1/admin/nodes/" + z + "/reconcile", status: 202, action: "node.reconcile", target: fixedID(z)},
		{route: "POST /api/v1/allocations", path: "/api/v1/allocations", body: apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, bearer: w.tenA, actor: "a-ci",
			status: 201, action: "allocation.create", target: func(b []byte) string { createdAlloc = jsonID(b); return createdAlloc }},
		{route: "POST /api/v1/allocations/{id}/release", path: "/api/v1/allocations/{createdAlloc}/release", bearer: w.tenA, actor: "a-ci",
			status: 200, action: "allocation.release", target: func([]byte) string { return createdAlloc }},
		{route: "PUT /api/v1/admin/tenants/{id}/quotas", path: "/api/v1/admin/tenants/" + w.tenAID + "/quotas", body: apiv1.QuotaSet{SKU: "h200-sxm-slice", MaxGPUs: refTo(100)},
			status: 200, action: "quota.set", target: fixedID(w.tenAID)},
		{route: "DELETE /api/v1/admin/tenants/{id}/quotas", path: "/api/v1/admin/tenants/" + w.tenAID + "/quotas?sku=h200-sxm-slice",
			status: 200, action: "quota.delete", target: fixedID(w.tenAID)},
		{route: "POST /api/v1/reservations", path: "/api/v1/reservations", body: apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 1}, bearer: w.tenA, actor: "a-ci",
			status: 201, action: "reservation.create", target: func(b []byte) string { createdReservation = jsonID(b); return createdReservation }},
		{route: "POST /api/v1/reservations/{id}/cancel", path: "/api/v1/reservations/{createdReservation}/cancel", bearer: w.tenA, actor: "a-ci",
			status: 200, action: "reservation.cancel", target: func([]byte) string { return createdReservation }},
		{route: "POST /api/v1/allocations/{id}/terminal", path: "/api/v1/allocations/" + active + "/terminal", body: apiv1.TerminalRequest{Mode: "terminal"}, bearer: w.tenA, actor: "a-ci",
			status: 201, action: "terminal.open", target: fixedID(active)},
		{route: "POST /api/v1/admin/os-images/{id}/activate", path: "/api/v1/admin/os-images/walk-a/activate", status: 200, action: "os_image.activate", target: jsonID},
		{route: "PUT /api/v1/admin/skus/{sku}/demand-mix", path: "/api/v1/admin/skus/h200-sxm-slice/demand-mix",
			body:   apiv1.DemandMixPin{Entries: []apiv1.DemandMixEntry{{GPUs: 1, Weight: 4}, {GPUs: 8, Weight: 1}}},
			status: 200, action: "sku.demand_mix.pin", target: fixedID("h200-sxm-slice")},
		{route: "DELETE /api/v1/admin/skus/{sku}/demand-mix", path: "/api/v1/admin/skus/h200-sxm-slice/demand-mix",
			status: 200, action: "sku.demand_mix.unpin", target: fixedID("h200-sxm-slice")},
		{route: "PUT /api/v1/admin/skus/{sku}/default-image", path: "/api/v1/admin/skus/h200-sxm-slice/default-image", body: apiv1.DefaultImageSet{Image: "walk-a"},
			status: 200, action: "sku.default_image", target: fixedID("h200-sxm-slice")},
		{route: "POST /api/v1/admin/skus/{sku}/image-rollout", path: "/api/v1/admin/skus/h200-sxm-slice/image-rollout", body: apiv1.ImageRolloutCreate{Image: "walk-b", SharePercent: 10},
			status: 201, action: "sku.image_rollout.start", target: fixedID("h200-sxm-slice")},
		{route: "POST /api/v1/admin/skus/{sku}/image-rollout/promote", path: "/api/v1/admin/skus/h200-sxm-slice/image-rollout/promote",
			status: 200, action: "sku.image_rollout.promote", target: fixedID("h200-sxm-slice")},
		{route: "POST /api/v1/admin/skus/{sku}/image-rollout/rollback", path: "/api/v1/admin/skus/h200-sxm-slice/image-rollout/rollback",
			status: 200, action: "sku.image_rollout.rollback", target: fixedID("h200-sxm-slice")},
		{route: "POST /api/v1/admin/os-images/{id}/smoke-tests", path: "/api/v1/admin/os-images/img/smoke-tests", body: apiv1.ImageSmokeTestCreate{Node: "node-z"},
			status: 201, action: "os_image.smoke_test", target: func(b []byte) string {
				var st apiv1.ImageSmokeTest
				_ = json.Unmarshal(b, &st)
				return st.AllocationID
			}},
	}

	// Coverage: every mutation route of the table is walked or excused.
	_, body := w.do("GET", "/api/v1/openapi.json", "", nil)
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	walked := map[string]bool{}
	for _, s := range steps {
		walked[s.route] = true
	}
	for p, ops := range doc.Paths {
		for m := range ops {
			route := strings.ToUpper(m) + " " + p
			if route[0] == 'G' {
				continue
			}
			if !walked[route] && notAudited[route] == "" {
				t.Errorf("mutation %s is neither walked here nor excused in notAudited", route)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	for i, s := range steps {
		path, reqBody := s.path, s.body
		path = strings.ReplaceAll(path, "{walkToken}", walkToken.ID)
		path = strings.ReplaceAll(path, "{walkHook}", walkHook.ID)
		path = strings.ReplaceAll(path, "{createdAlloc}", createdAlloc)
		path = strings.ReplaceAll(path, "{createdReservation}", createdReservation)
		client := w.plain
		switch reqBody {
		case "{walkEnroll}": // the node made two steps ago enrolls with its bootstrap token
			key, pubPEM := enrollKey(t)
			reqBody = apiv1.EnrollRequest{BootstrapToken: walkNode.BootstrapToken, PublicKeyPEM: pubPEM}
			s.target = func(b []byte) string {
				var en apiv1.Enrollment
				_ = json.Unmarshal(b, &en)
				cert, _ := w.certOf(key, en.CertificatePEM)
				walkNodeClient = httpClient(t, w.caFile, &cert)
				return walkNode.ID
			}
		case "{walkRenew}":
			_, pubPEM := enrollKey(t)
			reqBody = apiv1.EnrollRequest{PublicKeyPEM: pubPEM}
			client = walkNodeClient
		case "{discovered}":
			w.completeDiscovery(w.nodeX)
			reqBody = apiv1.SlotApprove{AllReady: true}
		}
		if s.client != nil {
			client = s.client
		}
		bearer := s.bearer
		if bearer == "" && client == w.plain && !strings.HasPrefix(path, "/api/v1/agent/") {
			bearer = w.admin
		}
		before := w.lastAuditID()
		reqID := fmt.Sprintf("walk-%02d", i)
		req, err := http.NewRequest(strings.SplitN(s.route, " ", 2)[0], w.srv.URL+path, bodyOf(reqBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Request-Id", reqID)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		code, out := sendReq(t, client, req)
		if code != s.status {
			t.Fatalf("%s (%s): %d, want %d: %s", s.route, path, code, s.status, out)
		}
		target := s.target(out)
		rows := w.auditSince(before)
		if len(rows) != 1 {
			t.Errorf("%s wrote %d audit rows, want 1: %+v", s.route, len(rows), rows)
			continue
		}
		r := rows[0]
		actor := s.actor
		if actor == "" {
			actor = "sec-admin"
		}
		if r.Action != s.action || r.TargetID != target || target == "" || r.TargetKind == "" || !strings.Contains(r.Actor, actor) ||
			r.ActorRole == "" || r.RequestID != reqID {
			t.Errorf("%s: audit row %+v, want action %s target %s actor ~%s request %s", s.route, r, s.action, target, actor, reqID)
		}
	}
}

// lastAuditID is the newest audit row's id (0 when none).
func (w *secWorld) lastAuditID() int64 {
	w.t.Helper()
	var l apiv1.List[apiv1.AuditEntry]
	w.must("GET", "/api/v1/admin/audit?limit=1", w.admin, nil, 200, &l)
	if len(l.Items) == 0 {
		return 0
	}
	return l.Items[0].ID
}

// auditSince returns the rows written after the row with id after.
func (w *secWorld) auditSince(after int64) []apiv1.AuditEntry {
	w.t.Helper()
	var l apiv1.List[apiv1.AuditEntry]
	w.must("GET", "/api/v1/admin/audit?limit=1000", w.admin, nil, 200, &l)
	var out []apiv1.AuditEntry
	for _, e := range l.Items {
		if e.ID > after {
			out = append(out, e)
		}
	}
	return out
}

// completeDiscovery has node n run its queued slice.topology_discover on a fixture 8x H200
// host tree (the real discovery code) and report the result.
func (w *secWorld) completeDiscovery(n enrolledNode) {
	t := w.t
	t.Helper()
	root := filepath.Join(t.TempDir(), "host")
	if err := fixture.Write(root, fixture.H200()); err != nil {
		t.Fatal(err)
	}
	rep, err := topology.Discover(hostfs.New(root))
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	code, body := call(t, n.client, "GET", w.srv.URL+"/api/v1/agent/tasks?wait=1s", "", nil)
	var env task.Envelope
	if code != 200 || json.Unmarshal(body, &env) != nil || env.Type != task.TypeTopologyDiscover {
		t.Fatalf("discovery task poll = %d %s", code, body)
	}
	res := task.Result{TaskID: env.TaskID, Attempt: env.Attempt, Status: "succeeded", Output: out, Phases: []task.Phase{}}
	if code, body := call(t, n.client, "POST", w.srv.URL+"/api/v1/agent/tasks/"+env.TaskID+"/result", "", res); code != 200 {
		t.Fatalf("discovery result = %d %s", code, body)
	}
}
