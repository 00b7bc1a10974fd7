package alloc

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func TestSliceCapabilityRule(t *testing.T) {
	now := time.Now()
	base := apiv1.Node{Status: "active", SKU: "bm", SliceSKU: "sl", SlotSummary: apiv1.SlotSummary{Total: 8, ByStatus: map[string]int{"available": 8}}}
	_, s := DeriveMode(base, 0, now)
	if s.SliceSupported || !reflect.DeepEqual(s.SliceMissing, []string{"profile tag gpuaas-profile-slice-vm", "verified firmware profile evidence"}) {
		t.Fatalf("untagged node = %+v", s)
	}
	n := base
	n.ProfileTags = []string{SliceProfileTag}
	n.FirmwareProfile = json.RawMessage(`{"evidence.json": {"status": "verified", "version": "2026.11"}}`)
	mode, s := DeriveMode(n, 0, now)
	if !s.SliceSupported || len(s.SliceMissing) != 0 || mode != apiv1.ModeBothCapable {
		t.Fatalf("complete node = %s %+v", mode, s)
	}
	n.FirmwareProfile = json.RawMessage(`{"status": "pending"}`)
	if _, s := DeriveMode(n, 0, now); s.SliceSupported {
		t.Fatal("pending firmware counted as verified")
	}
	// Heartbeat freshness: a silent agent makes the node unreachable, nothing else changes.
	old := now.Add(-time.Hour)
	n.LastHeartbeatAt = &old
	if mode, s := DeriveMode(n, time.Minute, now); mode != apiv1.ModeUnreachable || s.Slice || s.Baremetal {
		t.Fatalf("stale node = %s %+v", mode, s)
	}
}
