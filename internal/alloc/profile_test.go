package alloc

import (
	"encoding/json"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func TestResolveProfileInheritsFromTheDefault(t *testing.T) {
	sku := apiv1.SKU{SKU: "h200-sxm-slice", CapacityShape: "gpu_slice", ResourceProfile: json.RawMessage(`{
		"default_slice_vm_profile": "p1",
		"slice_vm_profiles": {
		  "p1": {"gpu_count": 1, "vcpu_count": 24, "memory_mib": 65536, "hugepages": {"enabled": true, "page_size": "1G"}, "guest_driver_profile": "ubuntu_24_04_nvidia_570_server_rdma"},
		  "p2": {"gpu_count": 2, "vcpu_count": 48, "memory_mib": 131072, "derived_from": "p1"},
		  "p4": {"gpu_count": 4, "vcpu_count": 96, "memory_mib": 262144, "derived_from": "p1", "guest_driver_profile": "other"}
		}}`)}
	cases := []struct {
		gpus           int
		name, driver   string
		wantHugepages  bool
		wantSource     string
		wantVCPU, wMem int
	}{
		{1, "p1", "ubuntu_24_04_nvidia_570_server_rdma", true, SourceSKUProfile, 24, 65536},
		{2, "p2", "ubuntu_24_04_nvidia_570_server_rdma", true, SourceSKUProfile, 48, 131072}, // inherited
		{4, "p4", "other", true, SourceSKUProfile, 96, 262144},                               // own value wins
		{8, "p1_x8", "ubuntu_24_04_nvidia_570_server_rdma", true, SourceScaled, 192, 524288},
	}
	for _, c := range cases {
		p, err := ResolveProfile(sku, c.gpus, "")
		if err != nil {
			t.Fatal(err)
		}
		if p.Name != c.name || p.GuestDriverProfile != c.driver || (len(p.Hugepages) > 0) != c.wantHugepages ||
			p.Source != c.wantSource || p.VCPUCount != c.wantVCPU || p.MemoryMiB != c.wMem {
			t.Errorf("%d GPUs: %+v", c.gpus, p)
		}
	}
}
