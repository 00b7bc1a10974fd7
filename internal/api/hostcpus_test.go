package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/topology"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

// discovered records a succeeded discovery of the generated 8x H200 host for node (the real
// discovery code over the fixture tree, written as hostd's result would be).
func (b *apiBundle) discovered(node string) {
	b.t.Helper()
	root := b.t.TempDir()
	if err := fixture.Write(root, fixture.H200()); err != nil {
		b.t.Fatal(err)
	}
	rep, err := topology.Discover(hostfs.New(root))
	if err != nil {
		b.t.Fatal(err)
	}
	out, _ := json.Marshal(rep)
	b.sql(`INSERT INTO node_tasks (node_id, type, payload, status, not_after, output, completed_at)
		SELECT id, 'slice.topology_discover', '{}', 'succeeded', now() + interval '1 hour', $2, now() FROM nodes WHERE name = $1`, node, out)
}

func (b *apiBundle) sql(q string, args ...any) {
	b.t.Helper()
	conn, err := pgx.Connect(context.Background(), b.dsn)
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), q, args...); err != nil {
		b.t.Fatalf("%s: %v", q, err)
	}
}

func (b *apiBundle) slots(node string) []apiv1.Slot {
	b.t.Helper()
	var l apiv1.List[apiv1.Slot]
	b.must("GET", "/api/v1/admin/nodes/"+node+"/slots", b.admin, nil, 200, &l)
	return l.Items
}

// refused checks an API refusal: its status, and a message in our words naming the slots.
func (b *apiBundle) refused(method, path string, body any, status int, msg string) {
	b.t.Helper()
	code, out := b.do(method, path, b.admin, body)
	if code != status {
		b.t.Fatalf("%s %s = %d, want %d: %s", method, path, code, status, out)
	}
	if e := apiError(b.t, out); e.Message != msg || strings.Contains(string(out), "SQLSTATE") {
		b.t.Fatalf("%s %s: message %q; want %q (%s)", method, path, e.Message, msg, out)
	}
}

// Approval gives each slot its own host CPU set: whole cores of its NUMA node with their SMT
// siblings, the first core of each node kept back for the host, the rest divided evenly
// (11 two-thread cores per slot on the H200 host), vcpu_count within the set. The housekeeping
// set is stored on the node; the dry run shows the same sets.
func TestApproveGivesEachSlotItsOwnCPUs(t *testing.T) {
	b := setup(t)
	b.must("POST", "/api/v1/admin/nodes", b.admin, apiv1.NodeCreate{Name: "h1", Region: "lab", SliceSKU: "h200-sxm-slice"}, 201, nil)
	b.discovered("h1")
	want := []string{"1-11,97-107", "12-22,108-118", "23-33,119-129", "34-44,130-140",
		"49-59,145-155", "60-70,156-166", "71-81,167-177", "82-92,178-188"}
	var dry apiv1.SlotApplyResult
	b.must("POST", "/api/v1/admin/nodes/h1/slots/approve", b.admin, apiv1.SlotApprove{AllReady: true, DryRun: true}, 200, &dry)
	if dry.Applied || dry.HousekeepingCPUs != "0,48,96,144" || len(dry.Changes) != 8 || dry.Changes[5].HostCPUs != want[5] {
		t.Fatalf("dry run = %+v", dry)
	}
	var res apiv1.SlotApplyResult
	b.must("POST", "/api/v1/admin/nodes/h1/slots/approve", b.admin, apiv1.SlotApprove{AllReady: true}, 200, &res)
	for i, s := range b.slots("h1") {
		if s.HostCPUs != want[i] || s.VCPUCount == nil || *s.VCPUCount != 22 {
			t.Fatalf("slot %d: host_cpus %q vcpus %v; want %q and 22", i, s.HostCPUs, s.VCPUCount, want[i])
		}
	}
	// Re-approving one slot gives it the same set; the others keep theirs.
	b.must("POST", "/api/v1/admin/nodes/h1/slots/approve", b.admin, apiv1.SlotApprove{SlotIndexes: []int{2}}, 200, &res)
	if got := b.slots("h1")[2].HostCPUs; got != want[2] {
		t.Fatalf("re-approved slot 2: %q; want %q", got, want[2])
	}
	// An explicit housekeeping set that a slot owns is refused, naming the slot.
	b.refused("POST", "/api/v1/admin/nodes/h1/slots/approve", apiv1.SlotApprove{SlotIndexes: []int{0}, HousekeepingCPUs: ptrTo("12,108")}, 400,
		"slot 1 cannot own host CPUs 12,108: they are the node's housekeeping CPUs")
}

// slots apply: a map's host_cpus are kept as written; a slot that omits them gets a set from
// the node's discovery; two slots sharing a CPU, a set off the slot's NUMA node and a
// vcpu_count above the set are refused, each naming the slot (and the slot holding the CPU).
func TestApplyChecksAndFillsHostCPUs(t *testing.T) {
	b := setup(t)
	b.must("POST", "/api/v1/admin/nodes", b.admin, apiv1.NodeCreate{Name: "h1", Region: "lab", SliceSKU: "h200-sxm-slice"}, 201, nil)
	b.discovered("h1")
	b.must("POST", "/api/v1/admin/nodes/h1/slots/approve", b.admin, apiv1.SlotApprove{AllReady: true}, 200, nil)
	specs := func() []apiv1.SlotSpec {
		var out []apiv1.SlotSpec
		for _, s := range b.slots("h1") {
			var md map[string]any
			_ = json.Unmarshal(s.CapacityMetadata, &md)
			out = append(out, apiv1.SlotSpec{SlotIndex: s.SlotIndex, GPUModel: s.GPUModel, PCIAddress: s.PCIAddress, NVMeDevice: s.NVMeDevice,
				NetworkFabric: s.NetworkFabric, FabricPCIAddress: s.FabricPCIAddress, NUMANode: s.NUMANode, VCPUCount: s.VCPUCount,
				MemoryMiB: s.MemoryMiB, HostCPUs: s.HostCPUs, MACAddress: s.MACAddress, PrivateIP: s.PrivateIP, CapacityMetadata: md})
		}
		return out
	}
	path := "/api/v1/admin/nodes/h1/slots"

	m := specs()
	m[1].HostCPUs = "11-22,107-118"
	b.refused("PUT", path, apiv1.SlotApply{Slots: m}, 400, "slot 1 cannot own host CPUs 11,107: slot 0 holds them")
	m = specs()
	m[4].HostCPUs, m[4].VCPUCount = "40-47", ptrTo(8)
	b.refused("PUT", path, apiv1.SlotApply{Slots: m}, 400, "slot 4: host CPU 40 is on NUMA node 0, not on the slot's node 1")
	m = specs()
	m[0].VCPUCount = ptrTo(23)
	b.refused("PUT", path, apiv1.SlotApply{Slots: m}, 400,
		"slot 0 asks for 23 vCPUs but owns only 22 host CPUs (1-11,97-107): lower its vcpu_count or give it more CPUs")
	m = specs()
	m[3].HostCPUs = "34-x"
	b.refused("PUT", path, apiv1.SlotApply{Slots: m}, 400, `slot 3: host_cpus: cpu list "34-x": "x" is not a CPU number (0-8191)`)

	// Edited sets are kept; omitted ones are filled, the same size as before.
	m = specs()
	m[7].HostCPUs, m[7].VCPUCount = "93-95,189-191", ptrTo(6)
	m[6].HostCPUs = ""
	var res apiv1.SlotApplyResult
	b.must("PUT", path, b.admin, apiv1.SlotApply{Slots: m}, 200, &res)
	got := b.slots("h1")
	if got[7].HostCPUs != "93-95,189-191" || got[6].HostCPUs != "71-81,167-177" || res.HousekeepingCPUs != "0,48,96,144" {
		t.Fatalf("slots 6, 7 = %q, %q; housekeeping %q", got[6].HostCPUs, got[7].HostCPUs, res.HousekeepingCPUs)
	}

	// The database's refusal reaches the client translated: slot 2 disabled, its CPU taken by
	// slot 3 (as no API would allow), then slot 2 enabled.
	b.must("POST", "/api/v1/admin/nodes/h1/slots/2/disable", b.admin, nil, 200, nil)
	b.sql(`UPDATE node_resource_slots s SET host_cpus = s.host_cpus || '{23}' FROM nodes n WHERE n.id = s.node_id AND n.name = 'h1' AND s.slot_index = 3`)
	b.refused("POST", "/api/v1/admin/nodes/h1/slots/2/enable", nil, 409, "slot 2 cannot own host CPUs 23: slot 3 holds them")
}

// Without a discovery, a map's slots without host_cpus stay without a set (and the node
// without a housekeeping set); the fixture map's explicit sets are stored as written.
func TestApplyWithoutDiscoveryKeepsWhatTheMapSays(t *testing.T) {
	b := setup(t)
	b.world()
	for i, s := range b.slots("n1") {
		if want := fmt.Sprintf("%d-%d,%d-%d", 12*i, 12*i+11, 96+12*i, 96+12*i+11); s.HostCPUs != want {
			t.Fatalf("slot %d: %q; want %q", i, s.HostCPUs, want)
		}
	}
	b.must("POST", "/api/v1/admin/nodes", b.admin, apiv1.NodeCreate{Name: "h2", Region: "lab", SliceSKU: "h200-sxm-slice"}, 201, nil)
	zero := 0
	var res apiv1.SlotApplyResult
	b.must("PUT", "/api/v1/admin/nodes/h2/slots", b.admin, apiv1.SlotApply{Slots: []apiv1.SlotSpec{{SlotIndex: 0, PCIAddress: "0000:1b:00.0",
		NVMeDevice: "/dev/disk/by-id/nvme-eui.77", NUMANode: &zero, MACAddress: "52:54:00:77:00:00", PrivateIP: "10.9.0.1"}}}, 200, &res)
	if s := b.slots("h2"); len(s) != 1 || s[0].HostCPUs != "" || res.HousekeepingCPUs != "" {
		t.Fatalf("slots %+v, housekeeping %q", s, res.HousekeepingCPUs)
	}
}
