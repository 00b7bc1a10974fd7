package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/store"
)

// Catalog endpoints: SKUs (products) and OS images. Request shape is validated here with
// messages an operator can act on; the schema re-checks enums and the digest rule.

var (
	skuRE        = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)
	slugRE       = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,94}$`)
	uuidShapedRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	digestRE     = regexp.MustCompile(`^[0-9a-f]{64}$`)
	currencyRE   = regexp.MustCompile(`^[A-Z]{3}$`)
	// default_username goes into cloud-init: a plain POSIX login name.
	usernameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

	// enums mirror the CHECK constraints of migrations/001_core.sql; "" (absent) is allowed
	// only where the column is nullable.
	enums = map[string][]string{
		"target":          {"baremetal", "vm_slice"},
		"family":          {"ubuntu", "rocky", "debian", "custom"},
		"architecture":    {"amd64", "arm64"},
		"image_format":    {"maas", "qcow2", "raw", "oci"},
		"source_type":     {"maas", "platform_storage", "oci_artifact", "http"},
		"driver_strategy": {"none", "preinstalled_nvidia", "preinstalled_rocm", "install_on_boot"},
		"accel_vendor":    {"", "nvidia", "amd", "any"},
		"image_fabric":    {"", "infiniband", "roce", "ethernet", "none", "any"},
		"sku_fabric":      {"infiniband", "roce", "ethernet", "none"},
		"topology_policy": {"any", "numa_preferred", "numa_required", "full_host"},
	}
)

const (
	maxDisplayName = 128
	maxSourceRef   = 2048
	digestRequired = "digest_sha256 is required: images are immutable artifacts identified by digest"
	digestFormat   = "digest_sha256 must be 64 lowercase hex characters (a sha256 digest)"
)

// oneOf checks v against the named enum and names the allowed values when it is not in it.
func oneOf(field, v, set string) error {
	allowed := enums[set]
	if slices.Contains(allowed, v) {
		return nil
	}
	var names []string
	for _, a := range allowed {
		if a != "" {
			names = append(names, a)
		}
	}
	if v == "" {
		return errInvalid("%s is required (one of %s)", field, strings.Join(names, ", "))
	}
	return errInvalid("%s %q is not one of %s", field, v, strings.Join(names, ", "))
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// isObject reports whether raw is a JSON object (absent or null counts as the empty object).
func isObject(raw json.RawMessage) bool {
	if isNull(raw) {
		return true
	}
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}

// ---- SKUs ----

// listSKUs serves GET /api/v1/skus (active products, any caller) and GET /api/v1/admin/skus
// (every product, admins).
func (s *Server) listSKUs(w http.ResponseWriter, r *http.Request, p Principal) error {
	all := p.IsAdmin() && strings.HasPrefix(r.URL.Path, "/api/v1/admin/")
	items, err := s.store.ListSKUs(r.Context(), !all)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.SKU]{Items: items})
	return nil
}

// validateResourceProfile checks a SKU resource_profile: a JSON object whose slice_vm_profiles
// (if any) have positive gpu_count (at most gpusTotal), vcpu_count and memory_mib, whose
// default_slice_vm_profile names one of them (and is required for gpu_slice SKUs, which
// cannot place without it), and whose topology_policy maps GPU counts to known policies.
func validateResourceProfile(raw json.RawMessage, shape string, gpusTotal int) error {
	if !isObject(raw) {
		return errInvalid("resource_profile must be a JSON object")
	}
	var top map[string]json.RawMessage
	if !isNull(raw) {
		_ = json.Unmarshal(raw, &top)
	}
	var def string
	if v, ok := top["default_slice_vm_profile"]; ok && !isNull(v) {
		if json.Unmarshal(v, &def) != nil || def == "" {
			return errInvalid("resource_profile.default_slice_vm_profile must be a non-empty string")
		}
	}
	profiles := map[string]json.RawMessage{}
	if v, ok := top["slice_vm_profiles"]; ok && !isNull(v) {
		if !isObject(v) || json.Unmarshal(v, &profiles) != nil {
			return errInvalid("resource_profile.slice_vm_profiles must be an object of named profiles")
		}
	}
	for _, name := range slices.Sorted(maps.Keys(profiles)) {
		var prof struct {
			GPUCount  int `json:"gpu_count"`
			VCPUCount int `json:"vcpu_count"`
			MemoryMiB int `json:"memory_mib"`
		}
		if !isObject(profiles[name]) || isNull(profiles[name]) || json.Unmarshal(profiles[name], &prof) != nil ||
			prof.GPUCount <= 0 || prof.VCPUCount <= 0 || prof.MemoryMiB <= 0 {
			return errInvalid("resource_profile.slice_vm_profiles.%s needs positive integer gpu_count, vcpu_count and memory_mib", name)
		}
		if prof.GPUCount > gpusTotal {
			return errInvalid("resource_profile.slice_vm_profiles.%s has gpu_count %d but the SKU has %d GPUs", name, prof.GPUCount, gpusTotal)
		}
	}
	if def != "" {
		if _, ok := profiles[def]; !ok {
			return errInvalid("resource_profile.default_slice_vm_profile %q is not in slice_vm_profiles", def)
		}
	} else if shape == "gpu_slice" {
		return errInvalid("a gpu_slice SKU needs resource_profile.default_slice_vm_profile naming one of slice_vm_profiles")
	}
	if v, ok := top["topology_policy"]; ok && !isNull(v) {
		var tp map[string]string
		if json.Unmarshal(v, &tp) != nil {
			return errInvalid("resource_profile.topology_policy must map GPU counts to policy names")
		}
		for _, k := range slices.Sorted(maps.Keys(tp)) {
			if n, err := strconv.Atoi(k); err != nil || n <= 0 {
				return errInvalid("resource_profile.topology_policy keys are GPU counts, got %q", k)
			}
			if err := oneOf("resource_profile.topology_policy["+k+"]", tp[k], "topology_policy"); err != nil {
				return err
			}
		}
	}
	return nil
}

// validateSKUPatch checks the fields set in p against the SKU they will apply to.
func validateSKUPatch(cur apiv1.SKU, p apiv1.SKUPatch) error {
	if p.DisplayName != nil && (strings.TrimSpace(*p.DisplayName) == "" || len(*p.DisplayName) > maxDisplayName) {
		return errInvalid("display_name must be 1..%d characters", maxDisplayName)
	}
	if p.AllowedGPUCounts != nil {
		if len(p.AllowedGPUCounts) == 0 {
			return errInvalid("allowed_gpu_counts must not be empty")
		}
		for i, c := range p.AllowedGPUCounts {
			if c <= 0 || c > cur.GPUsTotal || (i > 0 && c <= p.AllowedGPUCounts[i-1]) {
				return errInvalid("allowed_gpu_counts must be strictly increasing, each 1..%d (gpus_total), got %v",
					cur.GPUsTotal, p.AllowedGPUCounts)
			}
		}
		if cur.CapacityShape == "baremetal" && (len(p.AllowedGPUCounts) != 1 || p.AllowedGPUCounts[0] != cur.GPUsTotal) {
			return errInvalid("a baremetal SKU sells the whole node: allowed_gpu_counts must be [%d]", cur.GPUsTotal)
		}
	}
	if p.GPUHourlyPriceMinor != nil && *p.GPUHourlyPriceMinor < 0 {
		return errInvalid("gpu_hourly_price_minor must be >= 0")
	}
	if p.ResourceProfile != nil {
		if err := validateResourceProfile(*p.ResourceProfile, cur.CapacityShape, cur.GPUsTotal); err != nil {
			return err
		}
	}
	if p.ValidationPolicy != nil {
		switch *p.ValidationPolicy {
		case "", "none", "quick", "burn-in":
		default:
			return errInvalid("validation_policy must be none, quick or burn-in, not %q", *p.ValidationPolicy)
		}
	}
	return nil
}

// skuChanges describes a patch for the audit log: each field set, before and after.
func skuChanges(cur apiv1.SKU, p apiv1.SKUPatch) map[string]any {
	ch := map[string]any{}
	add := func(field string, from, to any) { ch[field] = map[string]any{"from": from, "to": to} }
	if p.WarmSlots != nil {
		add("warm_slots", cur.WarmSlots, *p.WarmSlots)
	}
	if p.RequiresSignedImages != nil {
		add("requires_signed_images", cur.RequiresSignedImages, *p.RequiresSignedImages)
	}
	if p.DisplayName != nil {
		add("display_name", cur.DisplayName, *p.DisplayName)
	}
	if p.AllowedGPUCounts != nil {
		add("allowed_gpu_counts", cur.AllowedGPUCounts, p.AllowedGPUCounts)
	}
	if p.GPUHourlyPriceMinor != nil {
		add("gpu_hourly_price_minor", cur.GPUHourlyPriceMinor, *p.GPUHourlyPriceMinor)
	}
	if p.ResourceProfile != nil {
		add("resource_profile", json.RawMessage(jsonOrEmpty(cur.ResourceProfile)), json.RawMessage(jsonOrEmpty(*p.ResourceProfile)))
	}
	if p.Active != nil {
		add("active", cur.Active, *p.Active)
	}
	if p.ValidationPolicy != nil {
		add("validation_policy", cur.ValidationPolicy, *p.ValidationPolicy)
	}
	return ch
}

func jsonOrEmpty(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return json.RawMessage("{}")
	}
	return raw
}

// patchSKU serves PATCH /api/v1/admin/skus/{sku}.
func (s *Server) patchSKU(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.SKUPatch
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.DisplayName == nil && req.AllowedGPUCounts == nil && req.GPUHourlyPriceMinor == nil &&
		req.ResourceProfile == nil && req.Active == nil && req.RequiresSignedImages == nil && req.WarmSlots == nil && req.ValidationPolicy == nil {
		return errInvalid("empty patch: set at least one of display_name, allowed_gpu_counts, gpu_hourly_price_minor, resource_profile, active, requires_signed_images, warm_slots, validation_policy")
	}
	if req.ResourceProfile != nil && isNull(*req.ResourceProfile) {
		return errInvalid("resource_profile cannot be null; send {} to clear it")
	}
	name := r.PathValue("sku")
	var out apiv1.SKU
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		cur, err := tx.GetSKU(r.Context(), name)
		if err != nil {
			return err
		}
		// gpus_total and capacity_shape are immutable, so validating against this read holds
		// even though PatchSKU takes the row lock afterwards.
		if err := validateSKUPatch(cur, req); err != nil {
			return err
		}
		if out, err = tx.PatchSKU(r.Context(), name, req); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "sku.patch", "sku", name, map[string]any{"changes": skuChanges(cur, req)}))
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("SKU " + name + " not found")
	}
	if err != nil {
		return err
	}
	if out.WarmSlots && req.WarmSlots != nil && s.dispatch != nil {
		// Warm slots turned on: the SKU's idle slots proven clean are staged now, not only
		// after their next release (best effort: a slot left cold is only a slower provision).
		if err := s.dispatch.StageSKU(r.Context(), name); err != nil {
			s.log.Warn("warm slots: staging not queued", "sku", name, "err", err)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// createSKU serves POST /api/v1/admin/skus.
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
	if err := oneOf("network_fabric", req.NetworkFabric, "sku_fabric"); err != nil {
		return err
	}
	if req.Currency != "" && !currencyRE.MatchString(req.Currency) {
		return errInvalid("currency must be an ISO 4217 code such as USD")
	}
	if req.CapacityShape == "baremetal" && (len(req.AllowedGPUCounts) != 1 || req.AllowedGPUCounts[0] != req.GPUsTotal) {
		return errInvalid("a baremetal SKU sells the whole node: allowed_gpu_counts must be [gpus_total]")
	}
	rp := req.ResourceProfile
	if err := validateSKUPatch(req, apiv1.SKUPatch{DisplayName: &req.DisplayName, AllowedGPUCounts: orEmpty(req.AllowedGPUCounts),
		GPUHourlyPriceMinor: &req.GPUHourlyPriceMinor, ResourceProfile: &rp, ValidationPolicy: &req.ValidationPolicy}); err != nil {
		return err
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

// ---- OS images ----

// listImages serves GET /api/v1/admin/os-images?target=&active=&family=&accelerator_vendor=&network_fabric=.
func (s *Server) listImages(w http.ResponseWriter, r *http.Request, _ Principal) error {
	q := r.URL.Query()
	f := store.ImageFilter{Target: q.Get("target"), Family: q.Get("family"),
		AcceleratorVendor: q.Get("accelerator_vendor"), NetworkFabric: q.Get("network_fabric")}
	for _, c := range [][3]string{{"target", f.Target, "target"}, {"family", f.Family, "family"},
		{"accelerator_vendor", f.AcceleratorVendor, "accel_vendor"}, {"network_fabric", f.NetworkFabric, "image_fabric"}} {
		if c[1] == "" {
			continue
		}
		if err := oneOf(c[0], c[1], c[2]); err != nil {
			return err
		}
	}
	if b, ok, err := queryBool(r, "active"); err != nil {
		return err
	} else if ok {
		f.Active = &b
	}
	items, err := s.store.ListImages(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, apiv1.List[apiv1.OSImage]{Items: items})
	return nil
}

// validateCompatibility checks compatibility_metadata: a JSON object whose compatible_skus,
// if present, is a list of SKU names (image resolution matches allocations against it).
func validateCompatibility(raw json.RawMessage) error {
	if !isObject(raw) {
		return errInvalid("compatibility_metadata must be a JSON object")
	}
	if isNull(raw) {
		return nil
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	if v, ok := m["compatible_skus"]; ok {
		var skus []string
		if json.Unmarshal(v, &skus) != nil || skus == nil {
			return errInvalid("compatibility_metadata.compatible_skus must be a list of SKU names")
		}
		for _, s := range skus {
			if !skuRE.MatchString(s) {
				return errInvalid("compatibility_metadata.compatible_skus: %q is not a SKU name", s)
			}
		}
	}
	return nil
}

func validateDigest(d string) error {
	if d == "" {
		return errInvalid(digestRequired)
	}
	if !digestRE.MatchString(d) {
		return errInvalid(digestFormat)
	}
	return nil
}

func validateSourceRef(ref string) error {
	if strings.TrimSpace(ref) == "" {
		return errInvalid("source_ref is required (where the artifact is fetched from)")
	}
	if len(ref) > maxSourceRef {
		return errInvalid("source_ref is longer than %d characters", maxSourceRef)
	}
	if !plainText(ref) || strings.ContainsAny(ref, " \t") {
		return errInvalid("source_ref must not hold whitespace or control characters")
	}
	// A source names its object plainly: no "." or ".." element, raw or (in a URL) escaped.
	// URLs are what hosts fetch: http, https, or a local file:///absolute/path.
	p := ref
	if strings.Contains(ref, "://") {
		u, err := url.Parse(ref)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file") {
			return errInvalid("source_ref %q must be an http, https or file URL", ref)
		}
		if (u.Scheme == "file") != (u.Host == "") || !strings.HasPrefix(u.Path, "/") || u.User != nil {
			return errInvalid("source_ref %q: want http(s)://host/path or file:///absolute/path, without credentials", ref)
		}
		p = u.Path
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." || seg == "." {
			return errInvalid("source_ref %q climbs out of its directory", ref)
		}
	}
	return nil
}

// validateImage checks a create request.
func validateImage(im apiv1.OSImage) error {
	if !slugRE.MatchString(im.Slug) {
		return errInvalid("slug must match %s", slugRE)
	}
	if uuidShapedRE.MatchString(im.Slug) {
		return errInvalid("slug must not look like a UUID: images are addressed by id or slug")
	}
	if strings.TrimSpace(im.DisplayName) == "" || len(im.DisplayName) > maxDisplayName {
		return errInvalid("display_name must be 1..%d characters", maxDisplayName)
	}
	if strings.TrimSpace(im.Version) == "" || len(im.Version) > 64 {
		return errInvalid("version must be 1..64 characters")
	}
	for _, c := range [][3]string{{"target", im.Target, "target"}, {"family", im.Family, "family"},
		{"architecture", im.Architecture, "architecture"}, {"image_format", im.ImageFormat, "image_format"},
		{"source_type", im.SourceType, "source_type"}, {"driver_strategy", im.DriverStrategy, "driver_strategy"},
		{"accelerator_vendor", im.AcceleratorVendor, "accel_vendor"}, {"network_fabric", im.NetworkFabric, "image_fabric"}} {
		if err := oneOf(c[0], c[1], c[2]); err != nil {
			return err
		}
	}
	if im.Target == "vm_slice" && im.ImageFormat != "qcow2" && im.ImageFormat != "raw" {
		return errInvalid("a vm_slice image is cloned onto the slice disk: image_format must be qcow2 or raw, not %s", im.ImageFormat)
	}
	if im.Target == "vm_slice" && im.SourceType == "maas" {
		return errInvalid("a vm_slice image cannot come from MAAS: source_type must be platform_storage, oci_artifact or http")
	}
	if err := validateSourceRef(im.SourceRef); err != nil {
		return err
	}
	if err := validateDigest(im.DigestSHA256); err != nil {
		return err
	}
	if im.SizeBytes != nil && *im.SizeBytes <= 0 {
		return errInvalid("size_bytes must be positive")
	}
	if strings.TrimSpace(im.DefaultUsername) == "" {
		return errInvalid("default_username is required (the login cloud-init creates)")
	}
	if !usernameRE.MatchString(im.DefaultUsername) {
		return errInvalid("default_username must match %s", usernameRE)
	}
	if err := validateCompatibility(im.CompatibilityMetadata); err != nil {
		return err
	}
	if im.IsDefault && !im.Active {
		return errInvalid("is_default requires an active image")
	}
	if im.Signature != "" {
		if err := imagesig.CheckSignature(im.Signature); err != nil {
			return errInvalid("signature: %v", err)
		}
	}
	return nil
}

// checkImageSignature refuses a signature that no trusted publisher key verifies for the
// image's digest: a host would refuse it later, so the catalog never records one.
func (s *Server) checkImageSignature(digest, sig string) error {
	if sig == "" {
		return nil
	}
	if _, err := imagesig.Verify(s.imageKeys, digest, sig); err != nil {
		return errInvalid("signature: %v (trusted keys: the controller's --image-keys file)", err)
	}
	return nil
}

// createImage serves POST /api/v1/admin/os-images.
func (s *Server) createImage(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.OSImage
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := validateImage(req); err != nil {
		return err
	}
	if err := s.checkImageSignature(req.DigestSHA256, req.Signature); err != nil {
		return err
	}
	var out apiv1.OSImage
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		var err error
		if out, err = tx.CreateImage(r.Context(), req); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "os_image.create", "os_image", out.ID, map[string]any{
			"slug": out.Slug, "target": out.Target, "version": out.Version, "digest_sha256": out.DigestSHA256,
			"source_type": out.SourceType, "source_ref": out.SourceRef, "active": out.Active, "is_default": out.IsDefault}))
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// getImage serves GET /api/v1/admin/os-images/{id} (id or slug).
func (s *Server) getImage(w http.ResponseWriter, r *http.Request, _ Principal) error {
	id := r.PathValue("id")
	out, err := s.store.GetImage(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("image " + id + " not found")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// validateImagePatch checks the fields set in p on their own.
func validateImagePatch(p apiv1.OSImagePatch) error {
	if p.DisplayName == nil && p.SourceRef == nil && p.DigestSHA256 == nil && p.SizeBytes == nil &&
		p.CompatibilityMetadata == nil && p.IsDefault == nil && p.Active == nil && p.Signature == nil {
		return errInvalid("empty patch: set at least one of display_name, source_ref, digest_sha256, size_bytes, compatibility_metadata, is_default, active, signature")
	}
	if p.Signature != nil && *p.Signature != "" {
		if err := imagesig.CheckSignature(*p.Signature); err != nil {
			return errInvalid("signature: %v", err)
		}
	}
	if p.DisplayName != nil && (strings.TrimSpace(*p.DisplayName) == "" || len(*p.DisplayName) > maxDisplayName) {
		return errInvalid("display_name must be 1..%d characters", maxDisplayName)
	}
	if p.SourceRef != nil {
		if err := validateSourceRef(*p.SourceRef); err != nil {
			return err
		}
	}
	if p.DigestSHA256 != nil && !digestRE.MatchString(*p.DigestSHA256) {
		return errInvalid(digestFormat)
	}
	if p.SizeBytes != nil && *p.SizeBytes <= 0 {
		return errInvalid("size_bytes must be positive")
	}
	if p.CompatibilityMetadata != nil {
		if isNull(*p.CompatibilityMetadata) {
			return errInvalid("compatibility_metadata cannot be null; send {} to clear it")
		}
		if err := validateCompatibility(*p.CompatibilityMetadata); err != nil {
			return err
		}
	}
	return nil
}

// imageChanges describes a patch for the audit log: each field set, before and after.
func imageChanges(cur apiv1.OSImage, p apiv1.OSImagePatch) map[string]any {
	ch := map[string]any{}
	add := func(field string, from, to any) { ch[field] = map[string]any{"from": from, "to": to} }
	if p.DisplayName != nil {
		add("display_name", cur.DisplayName, *p.DisplayName)
	}
	if p.SourceRef != nil {
		add("source_ref", cur.SourceRef, *p.SourceRef)
	}
	if p.DigestSHA256 != nil {
		add("digest_sha256", cur.DigestSHA256, *p.DigestSHA256)
	}
	if p.SizeBytes != nil {
		add("size_bytes", cur.SizeBytes, *p.SizeBytes)
	}
	if p.CompatibilityMetadata != nil {
		add("compatibility_metadata", jsonOrEmpty(cur.CompatibilityMetadata), jsonOrEmpty(*p.CompatibilityMetadata))
	}
	if p.IsDefault != nil {
		add("is_default", cur.IsDefault, *p.IsDefault)
	}
	if p.Active != nil {
		add("active", cur.Active, *p.Active)
	}
	return ch
}

// patchImage serves PATCH /api/v1/admin/os-images/{id}.
func (s *Server) patchImage(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req apiv1.OSImagePatch
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := validateImagePatch(req); err != nil {
		return err
	}
	id := r.PathValue("id")
	var out apiv1.OSImage
	err := s.store.InTx(r.Context(), func(tx *store.Tx) error {
		cur, err := tx.GetImage(r.Context(), id)
		if err != nil {
			return err
		}
		active, digest := cur.Active, cur.DigestSHA256
		if req.Active != nil {
			active = *req.Active
		}
		if req.DigestSHA256 != nil {
			digest = *req.DigestSHA256
		}
		if req.Signature != nil {
			if err := s.checkImageSignature(digest, *req.Signature); err != nil {
				return err
			}
		}
		if active && digest == "" {
			return errInvalid("image %s has no digest_sha256 and cannot be active: %s", cur.Slug, digestRequired)
		}
		// Activating (an inactive image made active, or an active one given a new digest)
		// takes a passed smoke test of the digest it will have, as images activate does.
		if active && (!cur.Active || digest != cur.DigestSHA256) {
			passed, err := tx.SmokePassed(r.Context(), cur.ID, digest)
			if err != nil {
				return err
			}
			if !passed {
				return apiErr(apiv1.CodeConflict, fmt.Sprintf("image %s has no passed smoke test of digest %s: run gpuaasctl images test %s --node NODE, then images activate",
					cur.Slug, digest, cur.Slug), nil)
			}
		}
		if req.IsDefault != nil && *req.IsDefault && !active {
			return errInvalid("is_default requires an active image (image %s is inactive)", cur.Slug)
		}
		// The schema re-checks the digest rule against the locked row (a concurrent patch).
		if out, err = tx.PatchImage(r.Context(), cur.ID, req); err != nil {
			return err
		}
		return tx.Audit(r.Context(), audit(r, p, "os_image.patch", "os_image", out.ID,
			map[string]any{"slug": out.Slug, "changes": imageChanges(cur, req)}))
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

// deleteImage serves DELETE /api/v1/admin/os-images/{id}: it retires the image (idempotent;
// running allocations keep their snapshot), or with ?hard=true deletes one that no allocation
// ever referenced (409 otherwise). The response is the image as it is now (retire) or as it
// was (hard delete).
func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request, p Principal) error {
	hard, _, err := queryBool(r, "hard")
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	var out apiv1.OSImage
	err = s.store.InTx(r.Context(), func(tx *store.Tx) error {
		cur, err := tx.GetImage(r.Context(), id)
		if err != nil {
			return err
		}
		details := map[string]any{"slug": cur.Slug, "digest_sha256": cur.DigestSHA256, "source_ref": cur.SourceRef}
		action := "os_image.retire"
		if hard {
			action = "os_image.delete"
			if err := tx.HardDeleteImage(r.Context(), cur.ID); err != nil {
				return err
			}
			out = cur
		} else {
			details["already_retired"] = cur.RetiredAt != nil && !cur.Active
			if err := tx.RetireImage(r.Context(), cur.ID); err != nil {
				return err
			}
			if out, err = tx.GetImage(r.Context(), cur.ID); err != nil {
				return err
			}
		}
		return tx.Audit(r.Context(), audit(r, p, action, "os_image", cur.ID, details))
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
