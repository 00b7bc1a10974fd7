package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

var (
	slugRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,94}$`)
	digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	enums    = map[string]map[string]bool{
		"target":          {"baremetal": true, "vm_slice": true},
		"family":          {"ubuntu": true, "rocky": true, "debian": true, "custom": true},
		"architecture":    {"amd64": true, "arm64": true},
		"image_format":    {"maas": true, "qcow2": true, "raw": true, "oci": true},
		"source_type":     {"maas": true, "platform_storage": true, "oci_artifact": true, "http": true},
		"driver_strategy": {"none": true, "preinstalled_nvidia": true, "preinstalled_rocm": true, "install_on_boot": true},
		"accel_vendor":    {"": true, "nvidia": true, "amd": true, "any": true},
		"image_fabric":    {"": true, "infiniband": true, "roce": true, "ethernet": true, "none": true, "any": true},
	}
)

func oneOf(field, v string, set string) error {
	if !enums[set][v] {
		var keys []string
		for k := range enums[set] {
			if k != "" {
				keys = append(keys, k)
			}
		}
		return errInvalid("%s %q is not one of %v", field, v, keys)
	}
	return nil
}

func isObject(raw json.RawMessage) bool {
	if len(raw) == 0 || string(raw) == "null" {
		return true
	}
	var m map[string]any
	return json.Unmarshal(raw, &m) == nil && m != nil
}

func (s *Server) listSKUs(w http.ResponseWriter, r *http.Request, p Principal) error {
	all := p.IsAdmin() && strings.HasPrefix(r.URL.Path, "/api/v1/admin/")
	items, err := s.store.ListSKUs(r.Context(), !all)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.SKU]{Items: items})
	return nil
}

func validateSKUPatch(cur apiv1.SKU, p apiv1.SKUPatch) error {
	if p.DisplayName != nil && (*p.DisplayName == "" || len(*p.DisplayName) > 128) {
		return errInvalid("display_name must be 1..128 characters")
	}
	if p.AllowedGPUCounts != nil {
		if len(p.AllowedGPUCounts) == 0 {
			return errInvalid("allowed_gpu_counts must not be empty")
		}
		for i, c := range p.AllowedGPUCounts {
			if c <= 0 || c > cur.GPUsTotal || (i > 0 && c <= p.AllowedGPUCounts[i-1]) {
				return errInvalid("allowed_gpu_counts must be strictly increasing, each 1..%d", cur.GPUsTotal)
			}
		}
	}
	if p.GPUHourlyPriceMinor != nil && *p.GPUHourlyPriceMinor < 0 {
		return errInvalid("gpu_hourly_price_minor must be >= 0")
	}
	if p.ResourceProfile != nil && len(*p.ResourceProfile) > 0 && string(*p.ResourceProfile) != "null" {
		var rp struct {
			Default  string `json:"default_slice_vm_profile"`
			Profiles map[string]struct {
				GPUCount  int `json:"gpu_count"`
				VCPUCount int `json:"vcpu_count"`
				MemoryMiB int `json:"memory_mib"`
			} `json:"slice_vm_profiles"`
			TopologyPolicy map[string]string `json:"topology_policy"`
		}
		if !isObject(*p.ResourceProfile) || json.Unmarshal(*p.ResourceProfile, &rp) != nil {
			return errInvalid("resource_profile must be a JSON object with the documented keys")
		}
		for name, prof := range rp.Profiles {
			if prof.GPUCount <= 0 || prof.VCPUCount <= 0 || prof.MemoryMiB <= 0 {
				return errInvalid("slice_vm_profiles.%s needs positive gpu_count, vcpu_count and memory_mib", name)
			}
		}
		if _, ok := rp.Profiles[rp.Default]; rp.Default != "" && !ok {
			return errInvalid("default_slice_vm_profile %q is not in slice_vm_profiles", rp.Default)
		}
		for k, v := range rp.TopologyPolicy {
			if _, err := strconv.Atoi(k); err != nil {
				return errInvalid("topology_policy keys are GPU counts, got %q", k)
			}
			switch v {
			case "any", "numa_preferred", "numa_required", "full_host":
			default:
				return errInvalid("topology_policy[%s] %q must be any, numa_preferred, numa_required or full_host", k, v)
			}
		}
	}
	return nil
}

func (s *Server) patchSKU(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.SKUPatch
	if err := decode(w, r, &req); err != nil {
		return err
	}
	name := r.PathValue("sku")
	var out apiv1.SKU
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		cur, err := tx.GetSKU(r.Context(), name)
		if err != nil {
			return err
		}
		if err := validateSKUPatch(cur, req); err != nil {
			return err
		}
		if out, err = tx.PatchSKU(r.Context(), name, req); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "sku.patch", "sku", name, req))
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("SKU " + name + " not found")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

var skuRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)

func (s *Server) createSKU(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.SKU
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if !skuRE.MatchString(req.SKU) {
		return errInvalid("sku must match %s", skuRE)
	}
	if req.Vendor == "" || req.DisplayName == "" {
		return errInvalid("vendor and display_name are required")
	}
	if req.CapacityShape != "gpu_slice" && req.CapacityShape != "baremetal" {
		return errInvalid("capacity_shape must be gpu_slice or baremetal")
	}
	if req.GPUsTotal <= 0 || req.GPUsTotal > 64 {
		return errInvalid("gpus_total must be 1..64")
	}
	if req.NetworkFabric == "" {
		req.NetworkFabric = "none"
	}
	if err := oneOf("network_fabric", req.NetworkFabric, "image_fabric"); err != nil || req.NetworkFabric == "any" {
		return errInvalid("network_fabric must be infiniband, roce, ethernet or none")
	}
	if req.Currency != "" && !regexp.MustCompile(`^[A-Z]{3}$`).MatchString(req.Currency) {
		return errInvalid("currency must be an ISO 4217 code such as USD")
	}
	if req.CapacityShape == "baremetal" && (len(req.AllowedGPUCounts) != 1 || req.AllowedGPUCounts[0] != req.GPUsTotal) {
		return errInvalid("a baremetal SKU sells the whole node: allowed_gpu_counts must be [gpus_total]")
	}
	rp := req.ResourceProfile
	if err := validateSKUPatch(req, apiv1.SKUPatch{AllowedGPUCounts: orEmpty(req.AllowedGPUCounts),
		GPUHourlyPriceMinor: &req.GPUHourlyPriceMinor, ResourceProfile: &rp}); err != nil {
		return err
	}
	if req.CapacityShape == "gpu_slice" {
		var prof struct {
			Default string `json:"default_slice_vm_profile"`
		}
		if json.Unmarshal(rp, &prof) != nil || prof.Default == "" {
			return errInvalid("a gpu_slice SKU needs resource_profile.default_slice_vm_profile and slice_vm_profiles")
		}
	}
	var out apiv1.SKU
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.CreateSKU(r.Context(), req); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "sku.create", "sku", out.SKU, req))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// orEmpty makes a nil slice an empty one so validation reports it as missing.
func orEmpty(v []int) []int {
	if v == nil {
		return []int{}
	}
	return v
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request, _ Principal) error {
	q := r.URL.Query()
	f := store.ImageFilter{Target: q.Get("target"), Family: q.Get("family")}
	if v := q.Get("active"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errInvalid("active must be true or false")
		}
		f.Active = &b
	}
	items, err := s.store.ListImages(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.OSImage]{Items: items})
	return nil
}

func validateImage(im apiv1.OSImage) error {
	if !slugRE.MatchString(im.Slug) {
		return errInvalid("slug must match %s", slugRE)
	}
	if im.DisplayName == "" || im.Version == "" || im.DefaultUsername == "" || im.SourceRef == "" {
		return errInvalid("display_name, version, default_username and source_ref are required")
	}
	if len(im.SourceRef) > 2048 {
		return errInvalid("source_ref is longer than 2048 characters")
	}
	for _, c := range [][3]string{{"target", im.Target, "target"}, {"family", im.Family, "family"},
		{"architecture", im.Architecture, "architecture"}, {"image_format", im.ImageFormat, "image_format"},
		{"source_type", im.SourceType, "source_type"}, {"driver_strategy", im.DriverStrategy, "driver_strategy"},
		{"accelerator_vendor", im.AcceleratorVendor, "accel_vendor"}, {"network_fabric", im.NetworkFabric, "image_fabric"}} {
		if err := oneOf(c[0], c[1], c[2]); err != nil {
			return err
		}
	}
	if im.DigestSHA256 == "" {
		return errInvalid("digest_sha256 is required: images are immutable artifacts identified by digest")
	}
	if !digestRE.MatchString(im.DigestSHA256) {
		return errInvalid("digest_sha256 must be 64 lowercase hex characters")
	}
	if im.SizeBytes != nil && *im.SizeBytes <= 0 {
		return errInvalid("size_bytes must be positive")
	}
	if !isObject(im.CompatibilityMetadata) {
		return errInvalid("compatibility_metadata must be a JSON object")
	}
	return nil
}

func (s *Server) createImage(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.OSImage
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := validateImage(req); err != nil {
		return err
	}
	var out apiv1.OSImage
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.CreateImage(r.Context(), req); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "os_image.create", "os_image", out.ID,
			map[string]any{"slug": out.Slug, "digest_sha256": out.DigestSHA256, "source_ref": out.SourceRef}))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request, _ Principal) error {
	out, err := s.store.GetImage(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("image " + r.PathValue("id") + " not found")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) patchImage(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.OSImagePatch
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.DigestSHA256 != nil && !digestRE.MatchString(*req.DigestSHA256) {
		return errInvalid("digest_sha256 must be 64 lowercase hex characters")
	}
	if req.CompatibilityMetadata != nil && !isObject(*req.CompatibilityMetadata) {
		return errInvalid("compatibility_metadata must be a JSON object")
	}
	if req.SourceRef != nil && (*req.SourceRef == "" || len(*req.SourceRef) > 2048) {
		return errInvalid("source_ref must be 1..2048 characters")
	}
	var out apiv1.OSImage
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.PatchImage(r.Context(), r.PathValue("id"), req); err != nil {
			return err
		}
		if out.Active && out.DigestSHA256 == "" {
			return errInvalid("an image without digest_sha256 cannot be active")
		}
		return tx.Audit(r.Context(), audit(r, p, "os_image.patch", "os_image", out.ID, req))
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("image " + r.PathValue("id") + " not found")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request, p Principal) error {
	hard := r.URL.Query().Get("hard") == "true"
	id := r.PathValue("id")
	var out apiv1.OSImage
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		cur, err := tx.GetImage(r.Context(), id)
		if err != nil {
			return err
		}
		action := "os_image.retire"
		if hard {
			action = "os_image.delete"
			err = tx.HardDeleteImage(r.Context(), id)
		} else {
			err = tx.RetireImage(r.Context(), id)
		}
		if err != nil {
			return err
		}
		if !hard {
			if out, err = tx.GetImage(r.Context(), id); err != nil {
				return err
			}
		} else {
			out = cur
		}
		return tx.Audit(r.Context(), audit(r, p, action, "os_image", cur.ID, map[string]any{"slug": cur.Slug}))
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("image " + id + " not found")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
