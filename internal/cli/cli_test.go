package cli

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/task"
)

var (
	created = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	active  = time.Date(2026, 3, 1, 10, 2, 30, 0, time.UTC)
)

func ptr[T any](v T) *T { return &v }

// sampleAlloc is an active 2-GPU slice allocation as an admin sees it (node and claims).
func sampleAlloc() apiv1.Allocation {
	return apiv1.Allocation{
		ID: "0c989b43-1027-4099-a9e1-70c9acad3fff", TenantID: "7d1e0f7a-tenant", SKU: "h200-sxm-slice",
		CapacityShape: "slice", GPUs: 2, Region: "lab", Status: "active", PlacementStatus: "placed",
		NodeID: "5b0c-node", NodeName: "h200-01", Node: "h200-01",
		Slots:   []apiv1.AllocationSlot{{SlotIndex: 0, NUMANode: ptr(0), Status: "active"}, {SlotIndex: 1, NUMANode: ptr(0), Status: "active"}},
		Profile: apiv1.ResolvedProfile{Name: "h200_2g_48c_128g", Source: "sku_profile", GPUCount: 2, VCPUCount: 48, MemoryMiB: 131072},
		Image:   &apiv1.ImageRef{ID: "img-1", Slug: "ubuntu-24.04-cuda", DigestSHA256: "abc123"},
		Price:   apiv1.Price{GPUHourlyPriceMinor: 350, Currency: "USD", GPUs: 2, CapacityShape: "slice"},
		Cost:    apiv1.Cost{BilledSeconds: 3600, AccruedMinor: 700, Currency: "USD"},
		Claims: []apiv1.Claim{
			{ID: "c1a1m000-aaaa", Kind: "slot", Status: "active", NodeID: "5b0c-node", SlotIndex: ptr(0), NUMANode: ptr(0),
				PCIAddress: "0000:1b:00.0", NVMeDevice: "/dev/disk/by-id/nvme-a", FabricVF: "0000:1c:00.2", MACAddress: "52:54:00:00:00:01", PrivateIP: "10.0.0.11"},
			{ID: "c1a1m111-bbbb", Kind: "slot", Status: "active", NodeID: "5b0c-node", SlotIndex: ptr(1), NUMANode: ptr(0),
				PCIAddress: "0000:2b:00.0", NVMeDevice: "/dev/disk/by-id/nvme-b"},
		},
		CreatedAt: created, ActiveAt: &active,
	}
}

func TestAllocCreate(t *testing.T) {
	t.Parallel()
	a := sampleAlloc()
	a.Status = "requested"
	fa := newFakeAPI(t, map[string]http.HandlerFunc{"POST /api/v1/allocations": reply(201, a)})
	env := fa.env(t)
	keyFile := filepath.Join(t.TempDir(), "id.pub")
	if err := os.WriteFile(keyFile, []byte("# mine\nssh-ed25519 AAAAC3Nza me@host\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	r := run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "--region", "lab", "--ssh-key", keyFile)
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.ErrOut)
	}
	want := "ID                                    STATUS     SKU             GPUS  NODE     SLOTS  REGION  CREATED\n" +
		"0c989b43-1027-4099-a9e1-70c9acad3fff  requested  h200-sxm-slice  2     h200-01  0,1    lab     2026-03-01 10:00:00Z\n"
	if r.Out != want {
		t.Fatalf("table:\n%s\nwant:\n%s", r.Out, want)
	}
	req := fa.last(t)
	if req.Header.Get("Authorization") != "Bearer admin-token" {
		t.Fatalf("Authorization = %q", req.Header.Get("Authorization"))
	}
	key1 := req.Header.Get("Idempotency-Key")
	if len(key1) < 16 {
		t.Fatalf("random Idempotency-Key = %q", key1)
	}
	var body apiv1.AllocationCreate
	if err := json.Unmarshal(req.Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.SKU != "h200-sxm-slice" || body.GPUs != 2 || body.Region != "lab" || len(body.SSHPublicKeys) != 1 || body.SSHPublicKeys[0] != "ssh-ed25519 AAAAC3Nza me@host" {
		t.Fatalf("body = %+v", body)
	}

	// A new invocation gets a new key; --idempotency-key is sent as given.
	run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2")
	if k := fa.last(t).Header.Get("Idempotency-Key"); k == key1 || k == "" {
		t.Fatalf("second invocation reused key %q", k)
	}
	run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "--idempotency-key", "retry-42")
	if k := fa.last(t).Header.Get("Idempotency-Key"); k != "retry-42" {
		t.Fatalf("--idempotency-key sent as %q", k)
	}

	r = run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "-o", "json")
	var back apiv1.Allocation
	if r.Code != 0 || json.Unmarshal([]byte(r.Out), &back) != nil || back.ID != a.ID || !strings.Contains(r.Out, `"capacity_shape": "slice"`) {
		t.Fatalf("json: %d %q", r.Code, r.Out)
	}
	r = run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "-o", "yaml")
	if r.Code != 0 || !strings.Contains(r.Out, "id: "+a.ID) || !strings.Contains(r.Out, "placement_status: placed") {
		t.Fatalf("yaml: %d %q", r.Code, r.Out)
	}

	r = run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "--ssh-key", filepath.Join(t.TempDir(), "none.pub"))
	if r.Code != cmdutil.ExitUsage || !strings.Contains(r.ErrOut, "--ssh-key") {
		t.Fatalf("missing key file: %d %q", r.Code, r.ErrOut)
	}
}

func TestAllocShow(t *testing.T) {
	t.Parallel()
	a := sampleAlloc()
	a.Tasks = []apiv1.AllocationTask{{ID: "9f8e7d6c-task", Type: "slice.vm_provision", Status: "succeeded", Attempt: 1,
		Phases: []apiv1.TaskPhase{{Name: "lease_acquire", Status: "ok", DurationMS: 120}, {Name: "readiness", Status: "ok", DurationMS: 2880}}}}
	fa := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/allocations/" + a.ID: reply(200, a)})
	r := run(t, fa.env(t), "alloc", "show", a.ID)
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.ErrOut)
	}
	want := `ID:            0c989b43-1027-4099-a9e1-70c9acad3fff
Tenant:        7d1e0f7a-tenant
SKU:           h200-sxm-slice
Shape:         slice
GPUs:          2
Region:        lab
Status:        active
Placement:     placed
Node:          h200-01 (5b0c-node)
Profile:       h200_2g_48c_128g (sku_profile): 48 vCPU, 131072 MiB memory
Image:         ubuntu-24.04-cuda (sha256:abc123)
Price:         3.50 USD per GPU-hour x 2 GPUs
Accrued cost:  7.00 USD (3600 s billed)
Created:       2026-03-01 10:00:00Z
Active since:  2026-03-01 10:02:30Z
Released:      -

Task 7d6ctask (slice.vm_provision, attempt 1): succeeded
  lease_acquire  ok  120ms  -
  readiness      ok  2.88s  -
  total              3s

CLAIM     KIND  STATUS  SLOT  NUMA  GPU PCI       NVME                    FABRIC VF     MAC                IP
m000aaaa  slot  active  0     0     0000:1b:00.0  /dev/disk/by-id/nvme-a  0000:1c:00.2  52:54:00:00:00:01  10.0.0.11
m111bbbb  slot  active  1     0     0000:2b:00.0  /dev/disk/by-id/nvme-b  -             -                  -
`
	if r.Out != want {
		t.Fatalf("show:\n%s\nwant:\n%s", r.Out, want)
	}

	// A tenant's view has no node or claims: nothing to print, nothing to crash on.
	a.NodeID, a.NodeName, a.Node, a.Slots, a.Claims, a.Image, a.Tasks, a.ActiveAt = "", "", "", nil, nil, nil, nil, nil
	fa = newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/allocations/" + a.ID: reply(200, a)})
	r = run(t, fa.env(t), "alloc", "show", a.ID)
	if r.Code != 0 || !strings.Contains(r.Out, "Node:          -\n") || !strings.Contains(r.Out, "Image:         -\n") || strings.Contains(r.Out, "CLAIM") {
		t.Fatalf("tenant view: %d\n%s", r.Code, r.Out)
	}
}

func TestAllocList(t *testing.T) {
	t.Parallel()
	a := sampleAlloc()
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/allocations": func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("status") == "released" {
				reply(200, apiv1.List[apiv1.Allocation]{})(w, r)
				return
			}
			reply(200, apiv1.List[apiv1.Allocation]{Items: []apiv1.Allocation{a}})(w, r)
		},
	})
	env := fa.env(t)
	r := run(t, env, "alloc", "list", "--status", "active")
	if r.Code != 0 || fa.last(t).Query != "status=active" {
		t.Fatalf("exit %d, query %q: %s", r.Code, fa.last(t).Query, r.ErrOut)
	}
	lines := strings.Split(strings.TrimSpace(r.Out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[1], "active") || !strings.Contains(lines[1], "h200-01") {
		t.Fatalf("table:\n%s", r.Out)
	}
	// Stable interface: `alloc list -o json` is a bare JSON array.
	r = run(t, env, "alloc", "ls", "-o", "json")
	var list []apiv1.Allocation
	if r.Code != 0 || json.Unmarshal([]byte(r.Out), &list) != nil || len(list) != 1 || list[0].ID != a.ID {
		t.Fatalf("json list: %d %q", r.Code, r.Out)
	}
	r = run(t, env, "alloc", "list", "--status", "released", "-o", "json")
	if r.Code != 0 || strings.TrimSpace(r.Out) != "[]" {
		t.Fatalf("empty json list: %q", r.Out)
	}
	r = run(t, env, "alloc", "list", "--status", "released")
	if r.Code != 0 || strings.Count(r.Out, "\n") != 1 {
		t.Fatalf("empty table should be the header only: %q", r.Out)
	}
}

func TestAllocExplain(t *testing.T) {
	t.Parallel()
	ex := apiv1.PlacementExplain{Feasible: false, Reason: apiv1.ReasonTopologyFragmented, Message: "4 GPUs are free but on different NUMA nodes",
		Choices: []apiv1.PlacementChoice{{NodeName: "h200-01", SlotIndexes: []int{0, 1}, NUMANodes: []int{0}, Reason: "partial"}}}
	fa := newFakeAPI(t, map[string]http.HandlerFunc{"POST /api/v1/placement/explain": reply(200, ex)})
	r := run(t, fa.env(t), "alloc", "explain", "--sku", "s", "--gpus", "4")
	if r.Code != 0 {
		t.Fatalf("infeasible is still exit 0: %d %s", r.Code, r.ErrOut)
	}
	for _, s := range []string{"Feasible:  false", "Reason:    topology_fragmented", "Message:   4 GPUs are free", "1     h200-01  0,1    0     partial"} {
		if !strings.Contains(r.Out, s) {
			t.Errorf("missing %q in:\n%s", s, r.Out)
		}
	}
	var req apiv1.PlacementRequest
	if json.Unmarshal(fa.last(t).Body, &req) != nil || req.SKU != "s" || req.GPUs != 4 {
		t.Fatalf("request body %s", fa.last(t).Body)
	}
}

func TestNodesShow(t *testing.T) {
	t.Parallel()
	hb := time.Date(2026, 3, 1, 9, 59, 0, 0, time.UTC)
	n := apiv1.Node{
		ID: "5b0c-node", Name: "h200-01", Status: "ready", Region: "lab", SKU: "h200-sxm-baremetal-8g", SliceSKU: "h200-sxm-slice",
		ProfileTags: []string{"gpuaas-profile-slice-vm"}, HardwareTags: []string{"gpu-nvidia-h200"}, LastHeartbeatAt: &hb,
		Mode: apiv1.ModeSliceActive,
		Schedulable: apiv1.Schedulable{Baremetal: false, Slice: true, Reasons: []string{"baremetal: slice allocations are live"},
			SliceSupported: true},
		SlotSummary: apiv1.SlotSummary{Total: 8, ByStatus: map[string]int{"available": 5, "active": 2, "disabled": 1},
			BySKU: []apiv1.SKUSlots{{SKU: "h200-sxm-slice", Available: 5}}, LiveSlotClaims: 2},
	}
	rep, _ := json.Marshal(task.ReconcileReport{Runtime: "libvirt", CheckedAt: hb, OrphanDomains: []string{"gpuaas-old"},
		Slots: []task.SlotDrift{{SlotIndex: 3, AllocationID: "a1", DomainState: "shutoff", Drift: []string{"domain gpuaas-a1 is shutoff, the allocation is active"}}}})
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/admin/nodes/h200-01":           reply(200, n),
		"GET /api/v1/admin/nodes/h200-01/reconcile": reply(200, apiv1.Reconcile{TaskID: "t1", Status: "succeeded", Report: rep}),
	})
	r := run(t, fa.env(t), "nodes", "show", "h200-01")
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.ErrOut)
	}
	want := `Name:              h200-01 (5b0c-node)
Region:            lab
Status:            ready
Mode:              slice_active
Draining:          false
Tenant:            -
SKU:               h200-sxm-baremetal-8g
Slice SKU:         h200-sxm-slice
Profile tags:      gpuaas-profile-slice-vm
Hardware tags:     gpu-nvidia-h200
Agent heartbeat:   2026-03-01 09:59:00Z
Schedulable:       baremetal=no slice=yes
                   - baremetal: slice allocations are live
Slice profile:     complete
Slots:             8 total
                   active: 2
                   available: 5
                   disabled: 1
Available by SKU:  h200-sxm-slice=5
Live claims:       slot=2 node_exclusive=0
Image cache:       not reported (sim runtime, or no heartbeat yet)
Drift:             2 findings (checked 2026-03-01 09:59:00Z)
                   - slot 3: domain gpuaas-a1 is shutoff, the allocation is active
                   - orphan domains: gpuaas-old
`
	if r.Out != want {
		t.Fatalf("nodes show:\n%s\nwant:\n%s", r.Out, want)
	}
	r = run(t, fa.env(t), "nodes", "show", "h200-01", "-o", "json")
	if r.Code != 0 || !strings.Contains(r.Out, `"mode": "slice_active"`) || !strings.Contains(r.Out, `"by_status"`) {
		t.Fatalf("json: %q", r.Out)
	}
}

func TestSlotsApplyDryRun(t *testing.T) {
	t.Parallel()
	res := apiv1.SlotApplyResult{Applied: false, HousekeepingCPUs: "0,96", Changes: []apiv1.SlotChange{
		{SlotIndex: 0, Action: "create", HostCPUs: "1-11,97-107"}, {SlotIndex: 1, Action: "update", Fields: []string{"host_cpus", "mac_address"}, HostCPUs: "12-22,108-118"},
		{SlotIndex: 2, Action: "disable"},
	}}
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"PUT /api/v1/admin/nodes/h200-01/slots": func(w http.ResponseWriter, r *http.Request) {
			var req apiv1.SlotApply
			_ = json.NewDecoder(r.Body).Decode(&req)
			out := res
			out.Applied = !req.DryRun
			reply(200, out)(w, r)
		},
	})
	mapFile := filepath.Join(t.TempDir(), "slots.yaml")
	if err := os.WriteFile(mapFile, []byte(`housekeeping_cpus: "0,96"
slots:
  - slot_index: 0
    pci_address: "0000:1b:00.0"
    nvme_device: /dev/disk/by-id/nvme-a
    numa_node: 0
    mac_address: "52:54:00:00:00:01"
    private_ip: 10.0.0.11
  - slot_index: 1
    pci_address: "0000:2b:00.0"
    nvme_device: /dev/disk/by-id/nvme-b
    numa_node: 0
    host_cpus: 12-22,108-118
    mac_address: "52:54:00:00:00:02"
    private_ip: 10.0.0.12
`), 0o644); err != nil {
		t.Fatal(err)
	}
	env := fa.env(t)
	r := run(t, env, "slots", "apply", "h200-01", "-f", mapFile, "--dry-run")
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.ErrOut)
	}
	var sent apiv1.SlotApply
	if err := json.Unmarshal(fa.last(t).Body, &sent); err != nil {
		t.Fatal(err)
	}
	if !sent.DryRun || len(sent.Slots) != 2 || sent.Slots[1].MACAddress != "52:54:00:00:00:02" || sent.Slots[0].NUMANode == nil ||
		sent.Slots[1].HostCPUs != "12-22,108-118" || sent.Slots[0].HostCPUs != "" || sent.HousekeepingCPUs == nil || *sent.HousekeepingCPUs != "0,96" {
		t.Fatalf("sent %+v", sent)
	}
	want := "SLOT  ACTION   HOST CPUS      FIELDS\n" +
		"0     create   1-11,97-107    -\n" +
		"1     update   12-22,108-118  host_cpus,mac_address\n" +
		"2     disable  -              -\n" +
		"\n" +
		"housekeeping CPUs: 0,96\n" +
		"dry run: nothing changed\n"
	if r.Out != want {
		t.Fatalf("diff:\n%q\nwant:\n%q", r.Out, want)
	}

	r = run(t, env, "slots", "apply", "h200-01", "-f", mapFile, "-o", "json")
	if err := json.Unmarshal(fa.last(t).Body, &sent); err != nil || sent.DryRun {
		t.Fatalf("without --dry-run the map is applied: %+v %v", sent, err)
	}
	if r.Code != 0 || !strings.Contains(r.Out, `"applied": true`) {
		t.Fatalf("apply json: %q", r.Out)
	}

	// A bad map never reaches the controller.
	before := len(fa.requests())
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	_ = os.WriteFile(bad, []byte("- slot_index: 0\n  pci_adress: typo\n"), 0o644)
	r = run(t, env, "slots", "apply", "h200-01", "-f", bad)
	if r.Code != cmdutil.ExitUsage || !strings.Contains(r.ErrOut, "pci_adress") || len(fa.requests()) != before {
		t.Fatalf("bad map: %d %q", r.Code, r.ErrOut)
	}
	_ = os.WriteFile(bad, []byte("- slot_index: 4\n  host_cpus: 3-1\n"), 0o644)
	r = run(t, env, "slots", "apply", "h200-01", "-f", bad)
	if r.Code != cmdutil.ExitUsage || !strings.Contains(r.ErrOut, "slot 4: host_cpus: cpu list \"3-1\": range 3-1 runs backwards") || len(fa.requests()) != before {
		t.Fatalf("bad host_cpus: %d %q", r.Code, r.ErrOut)
	}

}

// slots list and slots show print each slot's own host CPU set and vCPU count.
func TestSlotsListAndShowHostCPUs(t *testing.T) {
	t.Parallel()
	numa, vcpu, mem := 0, 22, 65536
	slots := []apiv1.Slot{
		{ID: "s0", SlotIndex: 0, Status: "available", NUMANode: &numa, VCPUCount: &vcpu, MemoryMiB: &mem, HostCPUs: "1-11,97-107",
			PCIAddress: "0000:1b:00.0", GPUModel: "NVIDIA H200", NVMeDevice: "/dev/disk/by-id/nvme-a", NetworkFabric: "infiniband",
			MACAddress: "52:54:00:00:00:01", PrivateIP: "10.0.0.11", CapacityMetadata: json.RawMessage(`{"fabric_vf_pci_address":"0000:1a:00.2","destructive_wipe_policy":"blkdiscard_zero_verify"}`)},
		{ID: "s1", SlotIndex: 1, Status: "reserved", NUMANode: &numa, VCPUCount: &vcpu, HostCPUs: "12-22,108-118", AllocationID: "a1",
			CapacityMetadata: json.RawMessage(`{}`)},
	}
	at := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	health := apiv1.SlotHealth{NodeName: "h200-01", SlotIndex: 0, Health: "quarantined", HealthReason: "GPU has fallen off the bus", HealthSince: &at,
		Events: []apiv1.HealthEvent{{At: at, Source: "kernel", Signal: "xid:79", Action: "quarantine", HealthBefore: "healthy",
			HealthAfter: "quarantined", Reason: "GPU has fallen off the bus"}},
		Validations: []apiv1.SlotValidation{{Level: "quick", Passed: false, RecordedAt: at, Checks: []apiv1.ValidationCheck{
			{Name: "pcie_config_space", Passed: false, Detail: "vendor id reads 0xffff"}, {Name: "device_reset", Simulated: true, Passed: true}}}}}
	slots[0].Health = "quarantined"
	fa := newFakeAPI(t, map[string]http.HandlerFunc{"GET /api/v1/admin/nodes/h200-01/slots": reply(200, apiv1.List[apiv1.Slot]{Items: slots}),
		"GET /api/v1/admin/nodes/h200-01/slots/0/health": reply(200, health)})
	r := run(t, fa.env(t), "slots", "list", "h200-01")
	want := "INDEX  STATUS     HEALTH       NUMA  HOST CPUS      VCPUS  GPU PCI       NVME                    FABRIC VF     MAC                IP         ALLOCATION\n" +
		"0      available  quarantined  0     1-11,97-107    22     0000:1b:00.0  /dev/disk/by-id/nvme-a  0000:1a:00.2  52:54:00:00:00:01  10.0.0.11  -\n" +
		"1      reserved   -            0     12-22,108-118  22     -             -                       -             -                  -          a1\n"
	if r.Code != 0 || r.Out != want {
		t.Fatalf("slots list: %d\n%s\nwant:\n%s", r.Code, r.Out, want)
	}
	r = run(t, fa.env(t), "slots", "show", "h200-01", "0")
	want = "Slot:         0 (s0)\n" +
		"Status:       available\n" +
		"NUMA node:    0\n" +
		"Host CPUs:    1-11,97-107\n" +
		"vCPUs:        22\n" +
		"Memory MiB:   65536\n" +
		"GPU:          0000:1b:00.0 NVIDIA H200\n" +
		"NVMe:         /dev/disk/by-id/nvme-a\n" +
		"Wipe policy:  blkdiscard_zero_verify\n" +
		"Fabric:       infiniband PF - VF 0000:1a:00.2\n" +
		"MAC / IP:     52:54:00:00:00:01 10.0.0.11\n" +
		"Allocation:   -\n" +
		"Health:       quarantined (GPU has fallen off the bus) since " + output.TimePtr(&at) + "\n" +
		"Validation:   quick failed at " + output.TimePtr(&at) + "\n" +
		"                pcie_config_space: FAILED (vendor id reads 0xffff)\n" +
		"                device_reset: simulated\n" +
		"Events:       " + output.TimePtr(&at) + " kernel xid:79 healthy -> quarantined: GPU has fallen off the bus\n"
	if r.Code != 0 || r.Out != want {
		t.Fatalf("slots show: %d\n%s\nwant:\n%s", r.Code, r.Out, want)
	}
	if r = run(t, fa.env(t), "slots", "show", "h200-01", "5"); r.Code == 0 || !strings.Contains(r.ErrOut, "node h200-01 has no slot 5") {
		t.Fatalf("missing slot: %d %q", r.Code, r.ErrOut)
	}
}

func TestTokensCreatePrintsTheToken(t *testing.T) {
	t.Parallel()
	tok := apiv1.Token{ID: "tok-id", Name: "ci", Role: "tenant", TenantID: "t1", Token: "gpa_secret"}
	fa := newFakeAPI(t, map[string]http.HandlerFunc{"POST /api/v1/admin/tokens": reply(201, tok)})
	r := run(t, fa.env(t), "tokens", "create", "--name", "ci", "--role", "tenant", "--tenant", "t1", "--ttl", "720h")
	if r.Code != 0 || r.Out != "gpa_secret\n" || !strings.Contains(r.ErrOut, "not shown again") {
		t.Fatalf("table: %d %q %q", r.Code, r.Out, r.ErrOut)
	}
	var sent apiv1.TokenCreate
	if json.Unmarshal(fa.last(t).Body, &sent) != nil || sent.TTL != "720h0m0s" || sent.TenantID != "t1" {
		t.Fatalf("sent %s", fa.last(t).Body)
	}
	r = run(t, fa.env(t), "tokens", "create", "--name", "ci", "--role", "tenant", "--tenant", "t1", "-o", "json")
	if r.Code != 0 || !strings.Contains(r.Out, `"token": "gpa_secret"`) || !strings.Contains(r.Out, `"id": "tok-id"`) {
		t.Fatalf("json: %q", r.Out)
	}
}

func TestVersionNeedsNoConfig(t *testing.T) {
	t.Parallel()
	r := run(t, map[string]string{"HOME": t.TempDir()}, "version")
	if r.Code != 0 || !strings.HasPrefix(r.Out, "Client:  gpuaasctl ") || !strings.Contains(r.Out, "Server:  unknown (invalid controller address") {
		t.Fatalf("version: %d %q %q", r.Code, r.Out, r.ErrOut)
	}
	r = run(t, map[string]string{"HOME": t.TempDir()}, "version", "--client", "-o", "json")
	if r.Code != 0 || !strings.Contains(r.Out, `"client": "dev"`) || strings.Contains(r.Out, "server") {
		t.Fatalf("version --client: %d %q %q", r.Code, r.Out, r.ErrOut)
	}
}

func TestVersionShowsTheServer(t *testing.T) {
	t.Parallel()
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/whoami": reply(200, apiv1.Whoami{Name: "admin", Role: "admin", ServerVersion: "v9.9.9"}),
	})
	r := run(t, fa.env(t), "version")
	if r.Code != 0 || !strings.Contains(r.Out, "Server:  gpuaas-controller v9.9.9") {
		t.Fatalf("version: %d %q %q", r.Code, r.Out, r.ErrOut)
	}
}
