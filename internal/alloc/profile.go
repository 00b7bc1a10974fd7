package alloc

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Profile sources recorded in the snapshot.
const (
	SourceSKUProfile    = "sku_profile"
	SourceScaled        = "scaled_from_default"
	SourceAdminOverride = "admin_override"
	SourceBaremetal     = "baremetal"
)

type vmProfile struct {
	GPUCount    int             `json:"gpu_count"`
	VCPUCount   int             `json:"vcpu_count"`
	MemoryMiB   int             `json:"memory_mib"`
	DerivedFrom string          `json:"derived_from"`
	Hugepages   json.RawMessage `json:"hugepages,omitempty"`
	// GuestDriverProfile is inherited by profiles derived from this one unless they set their own.
	GuestDriverProfile string `json:"guest_driver_profile,omitempty"`
}

type resourceProfile struct {
	Default        string               `json:"default_slice_vm_profile"`
	Profiles       map[string]vmProfile `json:"slice_vm_profiles"`
	TopologyPolicy map[string]string    `json:"topology_policy"`
}

// parsedProfiles memoizes parseResourceProfile by the profile's bytes: every create parses
// its SKU's profile twice (policy and VM shape) and SKUs are few. An edited SKU has new bytes,
// so a stale entry is never used; at most maxParsedProfiles are kept. Parsed profiles are
// shared and read only.
var (
	parsedProfiles    sync.Map // string(raw) -> resourceProfile
	parsedProfilesLen atomic.Int32
)

const maxParsedProfiles = 256

func parseResourceProfile(raw json.RawMessage) (resourceProfile, error) {
	var rp resourceProfile
	if len(raw) == 0 {
		return rp, nil
	}
	if v, ok := parsedProfiles.Load(string(raw)); ok {
		return v.(resourceProfile), nil
	}
	if err := json.Unmarshal(raw, &rp); err != nil {
		return rp, fmt.Errorf("sku resource_profile: %w", err)
	}
	if parsedProfilesLen.Add(1) <= maxParsedProfiles {
		parsedProfiles.Store(string(raw), rp)
	}
	return rp, nil
}

// ResolveProfile picks the VM shape for gpus GPUs of a slice SKU (seed 001 "Slice VM Runtime
// Profiles"): an admin override wins; else the SKU default when its GPU count matches; else a
// materialized profile derived from the default with that GPU count; else the default scaled.
func ResolveProfile(sku apiv1.SKU, gpus int, override string) (apiv1.ResolvedProfile, error) {
	if sku.CapacityShape == "baremetal" {
		if override != "" {
			return apiv1.ResolvedProfile{}, fmt.Errorf("baremetal SKUs have no VM profile to override")
		}
		return apiv1.ResolvedProfile{Name: "baremetal", Source: SourceBaremetal, GPUCount: gpus}, nil
	}
	rp, err := parseResourceProfile(sku.ResourceProfile)
	if err != nil {
		return apiv1.ResolvedProfile{}, err
	}
	if override != "" {
		p, ok := rp.Profiles[override]
		if !ok {
			return apiv1.ResolvedProfile{}, fmt.Errorf("profile %q is not defined for SKU %s (have: %v)", override, sku.SKU, profileNames(rp))
		}
		switch {
		case p.GPUCount == gpus:
			return materialize(override, SourceAdminOverride, p), nil
		case p.GPUCount == 1:
			r := scale(override, p, gpus)
			r.Source = SourceAdminOverride
			return r, nil
		default:
			return apiv1.ResolvedProfile{}, fmt.Errorf("profile %q is for %d GPUs, not %d", override, p.GPUCount, gpus)
		}
	}
	def, ok := rp.Profiles[rp.Default]
	if rp.Default == "" || !ok {
		return apiv1.ResolvedProfile{}, fmt.Errorf("SKU %s has no valid default_slice_vm_profile", sku.SKU)
	}
	if def.GPUCount == gpus {
		return materialize(rp.Default, SourceSKUProfile, def), nil
	}
	for _, name := range profileNames(rp) {
		p := rp.Profiles[name]
		if p.DerivedFrom == rp.Default && p.GPUCount == gpus {
			return materialize(name, SourceSKUProfile, inherit(p, def)), nil
		}
	}
	if def.GPUCount != 1 {
		return apiv1.ResolvedProfile{}, fmt.Errorf("SKU %s default profile is not a 1-GPU profile and none matches %d GPUs", sku.SKU, gpus)
	}
	return scale(rp.Default, def, gpus), nil
}

func materialize(name, source string, p vmProfile) apiv1.ResolvedProfile {
	return apiv1.ResolvedProfile{Name: name, Source: source, DerivedFrom: p.DerivedFrom, GPUCount: p.GPUCount,
		VCPUCount: p.VCPUCount, MemoryMiB: p.MemoryMiB, Hugepages: p.Hugepages, GuestDriverProfile: p.GuestDriverProfile}
}

// inherit fills what a derived profile leaves unset (hugepages, guest driver) from its parent.
func inherit(p, parent vmProfile) vmProfile {
	if len(p.Hugepages) == 0 {
		p.Hugepages = parent.Hugepages
	}
	if p.GuestDriverProfile == "" {
		p.GuestDriverProfile = parent.GuestDriverProfile
	}
	return p
}

func scale(name string, p vmProfile, gpus int) apiv1.ResolvedProfile {
	return apiv1.ResolvedProfile{Name: fmt.Sprintf("%s_x%d", name, gpus), Source: SourceScaled, DerivedFrom: name,
		GPUCount: gpus, VCPUCount: p.VCPUCount * gpus, MemoryMiB: p.MemoryMiB * gpus, Hugepages: p.Hugepages, GuestDriverProfile: p.GuestDriverProfile}
}

func profileNames(rp resourceProfile) []string {
	names := make([]string, 0, len(rp.Profiles))
	for n := range rp.Profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
