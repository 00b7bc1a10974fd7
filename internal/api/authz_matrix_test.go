package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Who may call an endpoint. The matrix states it per endpoint; it is not read from the
// route table (that would test the table against itself).
type matrixAccess int

const (
	accPublic matrixAccess = iota // everyone, anonymous included
	accUser                       // any API token (tenant or admin)
	accOwnA                       // tenant A (the owner) and admins; tenant B is told 404
	accAdmin                      // admin tokens; tenants get 403
	accNode                       // any enrolled host's certificate
	accOwnX                       // node X (the task's host); node Y is refused with hidden
	// accController is another controller replica's certificate only: no caller here holds
	// one (internal/faults proves the allowed cell with real replicas); node certificates
	// get 403, everyone else 401.
	accController
)

// matrixCaller is one column of the matrix.
type matrixCaller struct {
	name   string
	bearer string
	client *http.Client
}

// matrixCase is one row: the concrete request and what it must answer.
type matrixCase struct {
	path string // concrete path (ids filled in)
	body any
	who  matrixAccess
	// ok is the status every allowed caller gets; 0 means "the handler ran": any status
	// except 401, 403, 404, 429 and 5xx (a 400 or 409 from the handler still proves the
	// caller got past authorization). okMsg, when set, must be in the answer.
	ok    int
	okMsg string
	// hidden is what the other tenant / other node gets (accOwnA: 404 by default, so existence
	// does not leak); hiddenMsg must be in that answer.
	hidden    int
	hiddenMsg string
}

// TestAuthorizationMatrix calls every endpoint of the route table (read from the served
// OpenAPI document, which is generated from that table, plus /healthz and /metrics) as each
// kind of caller, and checks that exactly the intended cells are allowed: anonymous,
// expired and revoked tokens get 401 everywhere but the public endpoints; host certificates
// reach only agent endpoints and tokens never do; tenants get 403 on admin endpoints and
// 404 on another tenant's allocation or session; a host cannot report results or progress
// for another host's task. An endpoint without a row fails the test.
func TestAuthorizationMatrix(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{AuthFailures: api.RateLimit{Burst: -1}, Enroll: api.RateLimit{Burst: -1}})
	w.populate()

	// Tenant A's resources: an allocation to read and release, an active one with a
	// terminal session, a spare token and two tasks leased to node X.
	var released apiv1.Allocation
	w.must("POST", "/api/v1/allocations", w.tenA, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &released)
	active := w.activeAllocation()
	var ticket apiv1.TerminalTicket
	w.must("POST", "/api/v1/allocations/"+active+"/terminal", w.tenA, apiv1.TerminalRequest{Mode: "terminal"}, 201, &ticket)
	var hook apiv1.Webhook
	w.must("POST", "/api/v1/webhooks", w.tenA, apiv1.WebhookCreate{URL: "https://hooks.example.com/a"}, 201, &hook)
	spare := w.newToken("spare", "tenant", w.tenAID)
	var reservation apiv1.Reservation
	w.must("POST", "/api/v1/reservations", w.tenA, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &reservation)
	tasks := w.leasedTasks(w.nodeX, 2)
	_, renewPub := enrollKey(t)
	z := w.nodeZ.ID

	cases := map[string]matrixCase{
		"GET /healthz":              {path: "/healthz", who: accPublic, ok: 200},
		"GET /metrics":              {path: "/metrics", who: accPublic, ok: 200},
		"GET /readyz":               {path: "/readyz", who: accPublic, ok: 200},
		"GET /api/v1/openapi.json":  {path: "/api/v1/openapi.json", who: accPublic, ok: 200},
		"POST /api/v1/agent/enroll": {path: "/api/v1/agent/enroll", who: accPublic, body: apiv1.EnrollRequest{BootstrapToken: "gpb_not_issued", PublicKeyPEM: renewPub}, ok: 401, okMsg: "unknown bootstrap token"},

		"GET /api/v1/whoami":                    {path: "/api/v1/whoami", who: accUser, ok: 200},
		"GET /api/v1/skus":                      {path: "/api/v1/skus", who: accUser, ok: 200},
		"GET /api/v1/capacity":                  {path: "/api/v1/capacity", who: accUser, ok: 200},
		"POST /api/v1/placement/explain":        {path: "/api/v1/placement/explain", who: accUser, body: apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 1}, ok: 200},
		"POST /api/v1/allocations":              {path: "/api/v1/allocations", who: accUser, body: apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}},
		"GET /api/v1/allocations":               {path: "/api/v1/allocations", who: accUser, ok: 200},
		"GET /api/v1/allocations/{id}":          {path: "/api/v1/allocations/" + released.ID, who: accOwnA, ok: 200},
		"POST /api/v1/allocations/{id}/release": {path: "/api/v1/allocations/" + released.ID + "/release", who: accOwnA},
		"POST /api/v1/allocations/{id}/terminal": {path: "/api/v1/allocations/" + active + "/terminal", who: accOwnA,
			body: apiv1.TerminalRequest{Mode: "terminal"}, ok: 201},
		// Attaching needs the session's single-use token as well; a wrong one is refused by the
		// handler for everyone who got past authentication, the owner included.
		"GET /api/v1/terminal/{session}/attach": {path: "/api/v1/terminal/" + ticket.SessionID + "/attach", who: accUser, ok: 401, okMsg: "session token is invalid"},
		"GET /api/v1/sessions":                  {path: "/api/v1/sessions", who: accUser, ok: 200},
		"GET /api/v1/quotas":                    {path: "/api/v1/quotas", who: accUser, ok: 200},
		"POST /api/v1/reservations":             {path: "/api/v1/reservations", who: accUser, body: apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 1}},
		"GET /api/v1/reservations":              {path: "/api/v1/reservations", who: accUser, ok: 200},
		"GET /api/v1/reservations/{id}":         {path: "/api/v1/reservations/" + reservation.ID, who: accOwnA, ok: 200},
		// The owner's cancel ends it; the admin's, after, is told it has ended (409).
		"POST /api/v1/reservations/{id}/cancel": {path: "/api/v1/reservations/" + reservation.ID + "/cancel", who: accOwnA},
		"PUT /api/v1/admin/tenants/{id}/quotas": {path: "/api/v1/admin/tenants/" + w.tenAID + "/quotas", who: accAdmin,
			body: apiv1.QuotaSet{SKU: "h200-sxm-slice", MaxGPUs: refTo(1000)}, ok: 200},
		"DELETE /api/v1/admin/tenants/{id}/quotas": {path: "/api/v1/admin/tenants/" + w.tenAID + "/quotas?sku=h200-sxm-slice", who: accAdmin, ok: 200},
		"GET /api/v1/sessions/{session}":           {path: "/api/v1/sessions/" + ticket.SessionID, who: accOwnA, ok: 200},
		"GET /api/v1/events":                       {path: "/api/v1/events", who: accUser, ok: 200},
		"GET /api/v1/maintenance":                  {path: "/api/v1/maintenance", who: accUser, ok: 200},
		// An admin names the tenant (without one: 400, past authorization).
		"POST /api/v1/webhooks":                {path: "/api/v1/webhooks", who: accUser, body: apiv1.WebhookCreate{URL: "https://hooks.example.com/b"}},
		"GET /api/v1/webhooks":                 {path: "/api/v1/webhooks", who: accUser, ok: 200},
		"GET /api/v1/webhooks/{id}/deliveries": {path: "/api/v1/webhooks/" + hook.ID + "/deliveries", who: accOwnA, ok: 200},
		"DELETE /api/v1/webhooks/{id}":         {path: "/api/v1/webhooks/" + hook.ID, who: accOwnA, ok: 200},
		"GET /api/v1/sessions/{session}/recording": {path: "/api/v1/sessions/" + ticket.SessionID + "/recording", who: accOwnA,
			ok: 404, okMsg: "was not recorded", hiddenMsg: "not found"},

		"POST /api/v1/admin/nodes":                            {path: "/api/v1/admin/nodes", who: accAdmin, body: apiv1.NodeCreate{Name: "node-new", Region: "lab"}, ok: 201},
		"GET /api/v1/admin/nodes":                             {path: "/api/v1/admin/nodes", who: accAdmin, ok: 200},
		"GET /api/v1/admin/nodes/{id}":                        {path: "/api/v1/admin/nodes/" + z, who: accAdmin, ok: 200},
		"POST /api/v1/admin/nodes/{id}/drain":                 {path: "/api/v1/admin/nodes/" + z + "/drain", who: accAdmin, ok: 200},
		"POST /api/v1/admin/nodes/{id}/undrain":               {path: "/api/v1/admin/nodes/" + z + "/undrain", who: accAdmin, ok: 200},
		"GET /api/v1/admin/nodes/{id}/slots":                  {path: "/api/v1/admin/nodes/" + z + "/slots", who: accAdmin, ok: 200},
		"PUT /api/v1/admin/nodes/{id}/slots":                  {path: "/api/v1/admin/nodes/" + z + "/slots", who: accAdmin, body: map[string]any{"slots": []any{}, "dry_run": true}},
		"POST /api/v1/admin/nodes/{id}/slots/{index}/disable": {path: "/api/v1/admin/nodes/" + z + "/slots/7/disable", who: accAdmin, ok: 200},
		"POST /api/v1/admin/nodes/{id}/slots/{index}/enable":  {path: "/api/v1/admin/nodes/" + z + "/slots/7/enable", who: accAdmin, ok: 200},
		"GET /api/v1/admin/nodes/{id}/slots/{index}/health":   {path: "/api/v1/admin/nodes/" + z + "/slots/5/health", who: accAdmin, ok: 200},
		"POST /api/v1/admin/nodes/{id}/slots/{index}/quarantine": {path: "/api/v1/admin/nodes/" + z + "/slots/5/quarantine", who: accAdmin,
			body: apiv1.SlotHealthChange{Reason: "matrix"}, ok: 200},
		// A clear of the quarantine above without a validation is refused by the handler (409):
		// reaching it is what the matrix checks.
		"POST /api/v1/admin/nodes/{id}/slots/{index}/clear": {path: "/api/v1/admin/nodes/" + z + "/slots/5/clear", who: accAdmin,
			body: apiv1.SlotHealthChange{Reason: "matrix"}},
		"POST /api/v1/admin/nodes/{id}/slots/{index}/validate": {path: "/api/v1/admin/nodes/" + z + "/slots/4/validate", who: accAdmin, ok: 202},
		"GET /api/v1/admin/health":                             {path: "/api/v1/admin/health", who: accAdmin, ok: 200},
		"GET /api/v1/admin/health/policy":                      {path: "/api/v1/admin/health/policy", who: accAdmin, ok: 200},
		"GET /api/v1/admin/skus":                               {path: "/api/v1/admin/skus", who: accAdmin, ok: 200},
		"POST /api/v1/admin/skus": {path: "/api/v1/admin/skus", who: accAdmin, ok: 201, body: apiv1.SKU{SKU: "b200-bm", Vendor: "NVIDIA",
			DisplayName: "B200 node", CapacityShape: "baremetal", GPUsTotal: 8, AllowedGPUCounts: []int{8}}},
		"PATCH /api/v1/admin/skus/{sku}":                {path: "/api/v1/admin/skus/h200-sxm-slice", who: accAdmin, body: apiv1.SKUPatch{DisplayName: refTo("H200 slice")}, ok: 200},
		"GET /api/v1/admin/os-images":                   {path: "/api/v1/admin/os-images", who: accAdmin, ok: 200},
		"POST /api/v1/admin/os-images":                  {path: "/api/v1/admin/os-images", who: accAdmin, body: testImage("img-new"), ok: 201},
		"GET /api/v1/admin/os-images/{id}":              {path: "/api/v1/admin/os-images/" + w.imageID, who: accAdmin, ok: 200},
		"PATCH /api/v1/admin/os-images/{id}":            {path: "/api/v1/admin/os-images/img-new", who: accAdmin, body: apiv1.OSImagePatch{DisplayName: refTo("renamed")}, ok: 200},
		"DELETE /api/v1/admin/os-images/{id}":           {path: "/api/v1/admin/os-images/img-new", who: accAdmin, ok: 200},
		"GET /api/v1/admin/audit":                       {path: "/api/v1/admin/audit", who: accAdmin, ok: 200},
		"POST /api/v1/admin/os-images/{id}/smoke-tests": {path: "/api/v1/admin/os-images/" + w.imageID + "/smoke-tests", who: accAdmin, body: apiv1.ImageSmokeTestCreate{}, ok: 400, okMsg: "node is required"},
		"GET /api/v1/admin/os-images/{id}/smoke-tests":  {path: "/api/v1/admin/os-images/" + w.imageID + "/smoke-tests", who: accAdmin, ok: 200},
		"POST /api/v1/admin/os-images/{id}/activate":    {path: "/api/v1/admin/os-images/" + w.imageID + "/activate", who: accAdmin, ok: 409, okMsg: "no passed smoke test"},
		"GET /api/v1/admin/skus/{sku}/demand-mix":       {path: "/api/v1/admin/skus/h200-sxm-slice/demand-mix?region=lab", who: accAdmin, ok: 200, okMsg: `"source":`},
		"PUT /api/v1/admin/skus/{sku}/demand-mix": {path: "/api/v1/admin/skus/h200-sxm-slice/demand-mix", who: accAdmin,
			body: apiv1.DemandMixPin{Entries: []apiv1.DemandMixEntry{{GPUs: 1, Weight: 3}, {GPUs: 8, Weight: 1}}}, ok: 200, okMsg: `"source":"pinned"`},
		"DELETE /api/v1/admin/skus/{sku}/demand-mix":             {path: "/api/v1/admin/skus/h200-sxm-slice/demand-mix", who: accAdmin, ok: 200},
		"GET /api/v1/admin/skus/{sku}/image-rollout":             {path: "/api/v1/admin/skus/h200-sxm-slice/image-rollout", who: accAdmin, ok: 200},
		"PUT /api/v1/admin/skus/{sku}/default-image":             {path: "/api/v1/admin/skus/h200-sxm-slice/default-image", who: accAdmin, body: apiv1.DefaultImageSet{Image: w.imageID}, ok: 400, okMsg: "no passed smoke test"},
		"POST /api/v1/admin/skus/{sku}/image-rollout":            {path: "/api/v1/admin/skus/h200-sxm-slice/image-rollout", who: accAdmin, body: apiv1.ImageRolloutCreate{Image: w.imageID, SharePercent: 10}, ok: 409, okMsg: "no default image"},
		"POST /api/v1/admin/skus/{sku}/image-rollout/promote":    {path: "/api/v1/admin/skus/h200-sxm-slice/image-rollout/promote", who: accAdmin, ok: 409, okMsg: "no canary"},
		"POST /api/v1/admin/skus/{sku}/image-rollout/rollback":   {path: "/api/v1/admin/skus/h200-sxm-slice/image-rollout/rollback", who: accAdmin, ok: 409, okMsg: "nothing to roll back"},
		"POST /api/v1/admin/tenants":                             {path: "/api/v1/admin/tenants", who: accAdmin, body: map[string]string{"name": "tenant-new"}, ok: 201},
		"GET /api/v1/admin/tenants":                              {path: "/api/v1/admin/tenants", who: accAdmin, ok: 200},
		"POST /api/v1/admin/tokens":                              {path: "/api/v1/admin/tokens", who: accAdmin, body: apiv1.TokenCreate{Name: "new", Role: "admin"}, ok: 201},
		"GET /api/v1/admin/tokens":                               {path: "/api/v1/admin/tokens", who: accAdmin, ok: 200},
		"POST /api/v1/admin/tokens/{id}/revoke":                  {path: "/api/v1/admin/tokens/" + spare.ID + "/revoke", who: accAdmin, ok: 200},
		"POST /api/v1/admin/nodes/{id}/revoke":                   {path: "/api/v1/admin/nodes/" + z + "/revoke", who: accAdmin, ok: 200},
		"POST /api/v1/admin/nodes/{id}/slice-topology/discovery": {path: "/api/v1/admin/nodes/" + z + "/slice-topology/discovery", who: accAdmin, ok: 202},
		"GET /api/v1/admin/nodes/{id}/slice-topology/discovery":  {path: "/api/v1/admin/nodes/" + z + "/slice-topology/discovery", who: accAdmin, ok: 200},
		"POST /api/v1/admin/nodes/{id}/storage-transition":       {path: "/api/v1/admin/nodes/" + z + "/storage-transition", who: accAdmin, body: map[string]any{}},
		"POST /api/v1/admin/nodes/{id}/slots/{index}/wipe":       {path: "/api/v1/admin/nodes/" + z + "/slots/0/wipe", who: accAdmin, body: map[string]any{"apply": false}},
		"POST /api/v1/admin/nodes/{id}/reconcile":                {path: "/api/v1/admin/nodes/" + z + "/reconcile", who: accAdmin, ok: 202},
		"GET /api/v1/admin/nodes/{id}/reconcile":                 {path: "/api/v1/admin/nodes/" + z + "/reconcile", who: accAdmin, ok: 200},
		"POST /api/v1/admin/nodes/{id}/slots/approve":            {path: "/api/v1/admin/nodes/" + z + "/slots/approve", who: accAdmin, body: map[string]any{}},
		"POST /api/v1/admin/nodes/{id}/bootstrap-token":          {path: "/api/v1/admin/nodes/" + z + "/bootstrap-token", who: accAdmin, ok: 201},
		"GET /api/v1/tasks":                                      {path: "/api/v1/tasks", who: accAdmin, ok: 200},
		"GET /api/v1/tasks/{id}":                                 {path: "/api/v1/tasks/" + tasks[0], who: accAdmin, ok: 200},

		"POST /api/v1/agent/renew":     {path: "/api/v1/agent/renew", who: accNode, body: apiv1.EnrollRequest{PublicKeyPEM: renewPub}, ok: 201},
		"GET /api/v1/agent/tasks":      {path: "/api/v1/agent/tasks?wait=0s", who: accNode},
		"POST /api/v1/agent/heartbeat": {path: "/api/v1/agent/heartbeat", who: accNode, body: apiv1.Heartbeat{AgentVersion: "t", Runtime: "sim"}, ok: 204},
		"POST /api/v1/agent/health":    {path: "/api/v1/agent/health", who: accNode, body: apiv1.HealthReport{Signals: []apiv1.HealthSignal{}}, ok: 200},
		"POST /api/v1/agent/tasks/{id}/result": {path: "/api/v1/agent/tasks/" + tasks[0] + "/result", who: accOwnX, ok: 200, hidden: 404,
			body: task.Result{TaskID: tasks[0], Attempt: 1, Status: "failed", Error: "matrix", Phases: []task.Phase{}}},
		"POST /api/v1/agent/tasks/{id}/progress": {path: "/api/v1/agent/tasks/" + tasks[1] + "/progress", who: accOwnX, ok: 204, hidden: 409,
			body: task.Progress{Phases: []task.Phase{}}},
		// Like the client's attach: the host token of the session is needed on top of the certificate.
		"GET /api/v1/agent/terminal/{session}":          {path: "/api/v1/agent/terminal/" + ticket.SessionID, who: accNode, ok: 401, okMsg: "host token is invalid"},
		"GET /api/v1/replica/terminal/{session}/{side}": {path: "/api/v1/replica/terminal/" + ticket.SessionID + "/client", who: accController},
		"GET /api/v1/replica/recordings/{session}":      {path: "/api/v1/replica/recordings/" + ticket.SessionID, who: accController},
	}

	// Every served endpoint has a row, and every row is a served endpoint.
	_, body := w.do("GET", "/api/v1/openapi.json", "", nil)
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{"GET /healthz": true, "GET /metrics": true}
	for p, ops := range doc.Paths {
		for m := range ops {
			served[strings.ToUpper(m)+" "+p] = true
		}
	}
	if len(served) < 50 {
		t.Fatalf("only %d endpoints in the OpenAPI document", len(served))
	}
	var order []string
	for ep := range served {
		if _, ok := cases[ep]; !ok {
			t.Errorf("endpoint %s has no row in the authorization matrix: add one stating who may call it", ep)
		}
		order = append(order, ep)
	}
	for ep := range cases {
		if !served[ep] {
			t.Errorf("matrix row %s is not a served endpoint", ep)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// Creations before reads, updates and deletes of the same thing (a discovery is queued
	// before it is shown, an image created before it is patched and retired).
	rank := map[string]int{"POST": 0, "PUT": 1, "PATCH": 2, "GET": 3, "DELETE": 4}
	sort.Slice(order, func(i, j int) bool {
		mi, pi, _ := strings.Cut(order[i], " ")
		mj, pj, _ := strings.Cut(order[j], " ")
		if rank[mi] != rank[mj] {
			return rank[mi] < rank[mj]
		}
		return pi < pj
	})

	// Callers, refused ones first so an allowed call's effects cannot mask a refusal.
	callers := []matrixCaller{
		{"anonymous", "", w.plain},
		{"expired token", w.expired, w.plain},
		{"revoked token", w.revoked, w.plain},
		{"node Y", "", w.nodeY.client},
		{"tenant B", w.tenB, w.plain},
		{"node X", "", w.nodeX.client},
		{"tenant A", w.tenA, w.plain},
		{"admin", w.admin, w.plain},
	}
	// Tenants never see a host's identity, in any answer of any endpoint (the opaque
	// host-<hex> alias of their own allocations is all they get).
	hostIDs := []string{w.nodeX.ID, w.nodeX.Name, w.nodeY.ID, w.nodeY.Name, w.nodeZ.ID, w.nodeZ.Name}
	cells := 0
	for _, ep := range order {
		c := cases[ep]
		method, _, _ := strings.Cut(ep, " ")
		for _, who := range callers {
			want, wantMsg, allowed := matrixExpect(c, who.name)
			req, err := http.NewRequest(method, w.srv.URL+c.path, bodyOf(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if who.bearer != "" {
				req.Header.Set("Authorization", "Bearer "+who.bearer)
			}
			if strings.Contains(c.path, "attach") || strings.HasPrefix(c.path, "/api/v1/agent/terminal/") {
				req.Header.Set("X-Gpuaas-Session-Token", "gts_wrong")
			}
			got, out := sendReq(t, who.client, req)
			cells++
			cell := ep + " as " + who.name
			switch {
			case got >= 500:
				t.Errorf("%s: %d %s", cell, got, out)
			case allowed && want == 0:
				if got == 401 || got == 403 || got == 404 || got == 429 {
					t.Errorf("%s: %d, want the handler's answer (allowed): %s", cell, got, out)
				}
			case got != want:
				t.Errorf("%s: %d, want %d: %.300s", cell, got, want, out)
			case wantMsg != "" && !strings.Contains(string(out), wantMsg):
				t.Errorf("%s: %d as expected but the answer lacks %q: %.300s", cell, got, wantMsg, out)
			case !allowed && got == 401 && strings.Contains(string(out), c.okMsg) && c.okMsg != "":
				t.Errorf("%s: refused by the handler, not by authentication: %s", cell, out)
			}
			if sqlText.Match(out) {
				t.Errorf("%s: the answer carries SQL text: %.300s", cell, out)
			}
			if who.name == "tenant A" || who.name == "tenant B" {
				for _, id := range hostIDs {
					if strings.Contains(string(out), id) {
						t.Errorf("%s: the answer names host %q: %.300s", cell, id, out)
					}
				}
			}
		}
	}
	t.Logf("%d endpoints x %d callers = %d cells", len(order), len(callers), cells)

	// The refusals changed nothing: node Y's result for X's task was not recorded (X's was),
	// and X's second task is still leased to X.
	var tr apiv1.Task
	w.must("GET", "/api/v1/tasks/"+tasks[0], w.admin, nil, 200, &tr)
	if tr.Status != "failed" || tr.Error != "matrix" {
		t.Fatalf("task 0 = %s", tr.Status)
	}
	w.must("GET", "/api/v1/tasks/"+tasks[1], w.admin, nil, 200, &tr)
	if tr.Status != "leased" {
		t.Fatalf("task 1 = %s after node Y's progress report", tr.Status)
	}
}

// matrixExpect returns the status (and a substring of the answer) a matrixCaller must get, and whether
// the cell is an allowed one.
func matrixExpect(c matrixCase, who string) (int, string, bool) {
	bearerless := who == "anonymous" || who == "node X" || who == "node Y"
	badToken := who == "expired token" || who == "revoked token"
	isNode := who == "node X" || who == "node Y"
	hidden, hiddenMsg := c.hidden, c.hiddenMsg
	if hidden == 0 {
		hidden = 404
	}
	switch c.who {
	case accPublic:
		return c.ok, c.okMsg, true
	case accUser, accOwnA:
		if bearerless || badToken {
			return 401, "", false
		}
		if c.who == accOwnA && who == "tenant B" {
			return hidden, hiddenMsg, false
		}
		return c.ok, c.okMsg, true
	case accAdmin:
		if bearerless || badToken {
			return 401, "", false
		}
		if who == "admin" {
			return c.ok, c.okMsg, true
		}
		return 403, "", false
	case accNode, accOwnX:
		if !isNode {
			return 401, "", false
		}
		if c.who == accOwnX && who == "node Y" {
			return hidden, hiddenMsg, false
		}
		return c.ok, c.okMsg, true
	case accController:
		if isNode {
			return 403, "not a controller identity", false
		}
		return 401, "controller's client certificate", false
	}
	panic("unknown access")
}

func refTo[T any](v T) *T { return &v }

func bodyOf(v any) *strings.Reader {
	if v == nil {
		return strings.NewReader("")
	}
	b, _ := json.Marshal(v)
	return strings.NewReader(string(b))
}

func sendReq(t *testing.T, c *http.Client, req *http.Request) (int, []byte) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}
