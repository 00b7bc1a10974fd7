package slots

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// FuzzReadSlotMap parses arbitrary slot map files as `gpuaasctl slots apply -f -` does. It
// never panics; a bad map is a flag error (exit 2, usage); a good one has at least one slot
// and unique slot indexes, and is sent exactly as read: the JSON the client puts on the wire
// decodes, strictly, to the same slots.
func FuzzReadSlotMap(f *testing.F) {
	slot := "slot_index: 3\n  pci_address: 0000:1b:00.0\n  nvme_device: /dev/disk/by-id/nvme-x\n  mac_address: \"52:54:00:00:00:01\"\n  private_ip: 10.0.0.1\n  numa_node: 0\n"
	for _, s := range []string{
		"- " + slot,
		"slots:\n- " + slot + "  capacity_metadata: {sku: h200, n: 12345678901234567890, nested: {a: [1, 2.5, null]}}\n",
		`[{"slot_index":3,"pci_address":"0000:1b:00.0","nvme_device":"/dev/disk/by-id/nvme-x","numa_node":0}]`,
		"- slot_index: 0\n  pci_adress: typo\n",
		"- &a {slot_index: 1}\n- *a\n",
		"a: &a [*a]\n",
		"- slot_index: 1\n  nvme_device: \"/dev/disk/by-id/../../nvme0n1\"\n",
		"- slot_index: 99999999999999999999\n",
		"- {slot_index: 1, capacity_metadata: {? [x] : y}}\n",
		"- slot_index: 1\n  gpu_model: \"\\xff\"\n",
		"--- \n- slot_index: 1\n---\n- slot_index: 2\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		specs, err := ReadSlotMap(bytes.NewReader(doc), "-")
		if err != nil {
			if !isFlagError(err) {
				t.Fatalf("not a flag error: %v", err)
			}
			return
		}
		if len(specs) == 0 {
			t.Fatal("an empty map was accepted")
		}
		seen := map[int]bool{}
		for _, s := range specs {
			if seen[s.SlotIndex] {
				t.Fatalf("slot_index %d twice", s.SlotIndex)
			}
			seen[s.SlotIndex] = true
		}
		wire, err := json.Marshal(apiv1.SlotApply{Slots: specs})
		if err != nil {
			t.Fatalf("an accepted map cannot be sent: %v", err)
		}
		dec := json.NewDecoder(bytes.NewReader(wire))
		dec.DisallowUnknownFields()
		var back apiv1.SlotApply
		if err := dec.Decode(&back); err != nil {
			t.Fatalf("the server could not decode what the client sends: %v", err)
		}
		if !reflect.DeepEqual(back.Slots, specs) {
			t.Fatalf("the map changed on the wire:\nread %+v\nsent %+v", specs, back.Slots)
		}
	})
}
