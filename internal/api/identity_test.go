package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
)

// Two slots of one map naming one device identity are refused before the database, naming
// both slot indexes; a GPU and a fabric VF are one namespace (both PCI functions passed through).
func TestSlotMapSharingAnIdentityNamesBothSlots(t *testing.T) {
	b := setup(t)
	b.world()
	vf := func(m []apiv1.SlotSpec, i int) string { return m[i].CapacityMetadata["fabric_vf_pci_address"].(string) }
	cases := []struct {
		name  string
		field string
		edit  func(m []apiv1.SlotSpec)
	}{
		{"gpu", "pci_address", func(m []apiv1.SlotSpec) { m[3].PCIAddress = m[1].PCIAddress }},
		{"fabric vf", "fabric_vf_pci_address", func(m []apiv1.SlotSpec) { m[3].CapacityMetadata["fabric_vf_pci_address"] = vf(m, 1) }},
		{"vf named as a gpu", "PCI function", func(m []apiv1.SlotSpec) { m[3].PCIAddress = vf(m, 1) }},
		{"nvme", "nvme_device", func(m []apiv1.SlotSpec) { m[3].NVMeDevice = m[1].NVMeDevice }},
		{"mac", "mac_address", func(m []apiv1.SlotSpec) { m[3].MACAddress = m[1].MACAddress }},
		{"ip", "private_ip", func(m []apiv1.SlotSpec) { m[3].PrivateIP = m[1].PrivateIP }},
	}
	// A partition's by-id name (-partN) is its disk's: a slot owns a whole disk.
	m := fixtures.H200SlotMap(1)
	m[3].NVMeDevice = m[1].NVMeDevice + "-part1"
	code, body := b.do("PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: m})
	if e := apiError(t, body); code != 400 || !strings.Contains(e.Message, "slot 3: nvme_device") || !strings.Contains(e.Message, "names a partition") {
		t.Errorf("a partition as a slot's disk: %d %s", code, body)
	}
	for _, c := range cases {
		m := fixtures.H200SlotMap(1)
		c.edit(m)
		for _, dry := range []bool{true, false} {
			code, body := b.do("PUT", "/api/v1/admin/nodes/n1/slots", b.admin, apiv1.SlotApply{Slots: m, DryRun: dry})
			e := apiError(t, body)
			if code != 400 || !strings.Contains(e.Message, "slots 1 and 3 share "+c.field) {
				t.Errorf("%s (dry run %v): %d %s; want 400 naming slots 1 and 3 and %s", c.name, dry, code, body, c.field)
			}
		}
	}
}

// Across the API: approval gives a new slot a MAC no other node holds (the deterministic one
// taken, the next); enabling a slot whose MAC another node took meanwhile, and a slot map
// naming another node's MAC, are 409 naming the slot that holds it, in our words.
func TestIdentityConflictsNameTheHolderOverHTTP(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{})
	w.populate()
	x := w.nodeX
	taken := api.DeterministicMAC(x.ID, 0, 0)
	z := fixtures.H200SlotMap(1)
	z[0].MACAddress = taken
	w.must("PUT", "/api/v1/admin/nodes/node-z/slots", w.admin, apiv1.SlotApply{Slots: z}, 200, nil)

	w.must("POST", "/api/v1/admin/nodes/"+x.ID+"/slice-topology/discovery", w.admin, nil, 202, nil)
	w.completeDiscovery(x)
	w.must("POST", "/api/v1/admin/nodes/"+x.ID+"/slots/approve", w.admin, apiv1.SlotApprove{AllReady: true}, 200, nil)
	var xs apiv1.List[apiv1.Slot]
	w.must("GET", "/api/v1/admin/nodes/"+x.ID+"/slots", w.admin, nil, 200, &xs)
	if len(xs.Items) == 0 || xs.Items[0].MACAddress == taken || xs.Items[0].MACAddress != api.DeterministicMAC(x.ID, 0, 1) {
		t.Fatalf("approval gave slot 0 %q; node-z holds %q, want the next try %q", xs.Items[0].MACAddress, taken, api.DeterministicMAC(x.ID, 0, 1))
	}
	if len(xs.Items) < 3 || xs.Items[1].MACAddress != api.DeterministicMAC(x.ID, 1, 0) {
		t.Fatalf("approval moved a free MAC: %+v", xs.Items)
	}

	conflict := func(what string, code int, body []byte, holder string) {
		t.Helper()
		var e apiv1.Error
		_ = json.Unmarshal(body, &e)
		if code != 409 || e.Code != apiv1.CodeConflict || !strings.Contains(e.Message, "is already held by "+holder) ||
			strings.Contains(string(body), "SQLSTATE") || strings.Contains(string(body), "ERROR") {
			t.Fatalf("%s = %d %s; want 409 naming %s", what, code, body, holder)
		}
	}
	slotPath := func(i int, verb string) string {
		return fmt.Sprintf("/api/v1/admin/nodes/%s/slots/%d/%s", x.ID, i, verb)
	}
	w.must("POST", slotPath(1, "disable"), w.admin, nil, 200, nil)
	z[1].MACAddress = xs.Items[1].MACAddress
	w.must("PUT", "/api/v1/admin/nodes/node-z/slots", w.admin, apiv1.SlotApply{Slots: z}, 200, nil)
	code, body := w.do("POST", slotPath(1, "enable"), w.admin, nil)
	conflict("enable", code, body, "slot 1 on node node-z")

	z[2].MACAddress = xs.Items[2].MACAddress
	for _, dry := range []bool{true, false} {
		code, body := w.do("PUT", "/api/v1/admin/nodes/node-z/slots", w.admin, apiv1.SlotApply{Slots: z, DryRun: dry})
		conflict(fmt.Sprintf("apply (dry run %v)", dry), code, body, "slot 2 on node node-x")
	}
}
