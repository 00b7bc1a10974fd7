package api

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// TestNULAndDeepNestingAreRefusedAtTheDecoder: a \u0000 in any string and over-deep nesting
// are 400s from the decoder, for every request type, before anything reaches the database.
func TestNULAndDeepNestingAreRefusedAtTheDecoder(t *testing.T) {
	deep := `{"sku":"h200-sxm-slice","gpus":1,"x":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `}`
	for _, body := range []string{
		`{"sku":"h200\u0000-sxm-slice","gpus":1}`,
		`{"region":"lab\u0000"}`,
		`{"\u0000":1}`,
		`{"slots":[{"slot_index":0,"capacity_metadata":{"k":"v\u0000"}}]}`,
		deep,
	} {
		for _, mk := range bodyTypes {
			err := decodeBody([]byte(body), mk())
			if !isBadRequest(err) {
				t.Fatalf("%T accepted or mis-refused %.60q: %v", mk(), body, err)
			}
			if !strings.Contains(err.Error(), "NUL") && !strings.Contains(err.Error(), "deeper") {
				t.Fatalf("%T refused %.60q for another reason: %v", mk(), body, err)
			}
		}
	}
	// An escaped backslash followed by u0000 is text, not a NUL; nesting at the bound decodes.
	var a apiv1.AllocationCreate
	if err := decodeBody([]byte(`{"sku":"a\\u0000b","gpus":1}`), &a); err != nil || a.SKU != `a\u0000b` {
		t.Fatalf("escaped backslash: %v %q", err, a.SKU)
	}
	var sa apiv1.SlotApply
	ok := `{"slots":[{"slot_index":0,"capacity_metadata":{"k":` + strings.Repeat("[", maxJSONDepth-4) + strings.Repeat("]", maxJSONDepth-4) + `}}]}`
	if err := decodeBody([]byte(ok), &sa); err != nil {
		t.Fatalf("nesting within the bound refused: %v", err)
	}
}

// TestCapacityMetadataIsBounded: a slot's free-form capacity_metadata above 16 KiB of JSON is
// refused with the slot named, so one slot cannot make every listing print megabytes.
func TestCapacityMetadataIsBounded(t *testing.T) {
	sp := apiv1.SlotSpec{SlotIndex: 3, PCIAddress: "0000:1b:00.0", NVMeDevice: "/dev/disk/by-id/nvme-x", MACAddress: "52:54:00:00:00:01",
		PrivateIP: "10.0.0.1", CapacityMetadata: map[string]any{"note": strings.Repeat("x", maxCapacityMetadata)}}
	err := ValidateSlotMap([]apiv1.SlotSpec{sp})
	if !isBadRequest(err) || !strings.Contains(err.Error(), "slot 3: capacity_metadata is larger than") {
		t.Fatalf("oversized capacity_metadata: %v", err)
	}
	sp.CapacityMetadata = map[string]any{"storage_ownership": "slice"}
	if err := ValidateSlotMap([]apiv1.SlotSpec{sp}); err != nil && strings.Contains(err.Error(), "capacity_metadata is larger") {
		t.Fatalf("a small capacity_metadata refused: %v", err)
	}
}
