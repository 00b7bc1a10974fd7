package api_test

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// A queued task its host's gpuaas-hostd does not decode says so, in the tenant's alloc show
// (without naming the host) and in the admin's nodes show; a task it decodes says nothing.
func TestWaitingTasksSayWhichHostdTheyNeed(t *testing.T) {
	b := setup(t)
	b.world()
	var a apiv1.Allocation
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, 201, &a)
	// n1 has reported no schemas (a 0.1.0 host): version 1 is fine, version 2 waits.
	b.sql(`INSERT INTO node_tasks (node_id, allocation_id, type, payload, not_after, schema_version)
		SELECT node_id, id, 'slice.vm_provision', '{}', now() + interval '1 hour', 2 FROM allocations WHERE id = $1`, a.ID)
	b.sql(`INSERT INTO node_tasks (node_id, allocation_id, type, payload, not_after)
		SELECT node_id, id, 'slice.vm_release', '{}', now() + interval '1 hour' FROM allocations WHERE id = $1`, a.ID)
	const want = "host needs a gpuaas-hostd that decodes slice.vm_provision schema 2 (it runs an unknown version)"

	var got apiv1.Allocation
	b.must("GET", "/api/v1/allocations/"+a.ID, b.tenant, nil, 200, &got)
	waiting := map[string]string{}
	for _, tk := range got.Tasks {
		waiting[tk.Type] = tk.Waiting
	}
	if waiting["slice.vm_provision"] != want || waiting["slice.vm_release"] != "" {
		t.Fatalf("alloc show tasks waiting %q", waiting)
	}
	if strings.Contains(waiting["slice.vm_provision"], "n1") {
		t.Fatal("a tenant's view names the host")
	}
	var n apiv1.Node
	b.must("GET", "/api/v1/admin/nodes/n1", b.admin, nil, 200, &n)
	if len(n.Waiting) != 1 || n.Waiting[0] != "1 slice.vm_provision schema 2 task(s) queued: "+want {
		t.Fatalf("nodes show waiting %q", n.Waiting)
	}
}
