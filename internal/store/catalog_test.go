package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
)

// catalogDB opens a store on a fresh migrated database (TestMain is in another file).
func catalogDB(t *testing.T) (*store.Store, string) {
	t.Helper()
	t.Parallel()
	url := pgtest.NewDatabase(t)
	st, err := store.Open(context.Background(), url, store.Options{AllowUntestedImages: true}) // fixtures register active images
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, url
}

func catRef[T any](v T) *T { return &v }

func catDigest(n int) string { return fmt.Sprintf("%064x", n) }

// testImage is a valid active vm_slice image.
func testImage(slug string, n int) apiv1.OSImage {
	return apiv1.OSImage{Slug: slug, DisplayName: "Image " + slug, Version: "1", Target: "vm_slice", Family: "debian",
		Architecture: "amd64", AcceleratorVendor: "nvidia", NetworkFabric: "infiniband", ImageFormat: "qcow2",
		SourceType: "http", SourceRef: "https://images.example/" + slug + ".qcow2", DigestSHA256: catDigest(n),
		CloudInitSupported: true, DefaultUsername: "debian", DriverStrategy: "preinstalled_nvidia", Active: true}
}

func createImage(t *testing.T, st *store.Store, im apiv1.OSImage) apiv1.OSImage {
	t.Helper()
	var out apiv1.OSImage
	if err := st.InTx(context.Background(), func(tx *store.Tx) error {
		var err error
		out, err = tx.CreateImage(context.Background(), im)
		return err
	}); err != nil {
		t.Fatalf("create image %s: %v", im.Slug, err)
	}
	return out
}

func patchImage(st *store.Store, idOrSlug string, p apiv1.OSImagePatch) (apiv1.OSImage, error) {
	var out apiv1.OSImage
	err := st.InTx(context.Background(), func(tx *store.Tx) error {
		var err error
		out, err = tx.PatchImage(context.Background(), idOrSlug, p)
		return err
	})
	return out, err
}

func TestCatalogSeededSKUs(t *testing.T) {
	st, _ := catalogDB(t)
	ctx := context.Background()
	skus, err := st.ListSKUs(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range skus {
		names = append(names, s.SKU)
	}
	if want := []string{"amd-mi300x-roce-slice", "h200-sxm-baremetal-8g", "h200-sxm-slice"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("active SKUs = %v, want %v", names, want)
	}

	h, err := st.GetSKU(ctx, "h200-sxm-slice")
	if err != nil {
		t.Fatal(err)
	}
	if h.Vendor != "NVIDIA" || h.DisplayName != "NVIDIA H200 GPU VM" || h.AcceleratorModel != "h200" ||
		h.CapacityShape != "gpu_slice" || h.GPUsTotal != 8 || !reflect.DeepEqual(h.AllowedGPUCounts, []int{1, 2, 4, 8}) ||
		h.GPUHourlyPriceMinor != 450 || h.Currency != "USD" || h.NetworkFabric != "infiniband" || h.ExclusiveNode || !h.Active {
		t.Fatalf("h200-sxm-slice = %+v", h)
	}
	var rp struct {
		Default  string                     `json:"default_slice_vm_profile"`
		Profiles map[string]json.RawMessage `json:"slice_vm_profiles"`
	}
	if err := json.Unmarshal(h.ResourceProfile, &rp); err != nil {
		t.Fatal(err)
	}
	if rp.Default != "h200_1g_24c_64g" || len(rp.Profiles) != 5 || rp.Profiles["h200_1g_24c_64g"] == nil {
		t.Fatalf("h200 resource_profile = %s", h.ResourceProfile)
	}

	amd, err := st.GetSKU(ctx, "amd-mi300x-roce-slice")
	if err != nil {
		t.Fatal(err)
	}
	if amd.Vendor != "AMD" || amd.NetworkFabric != "roce" || !reflect.DeepEqual(amd.AllowedGPUCounts, []int{1, 2, 4}) ||
		amd.GPUHourlyPriceMinor != 400 || amd.CapacityShape != "gpu_slice" || amd.GPUsTotal != 8 {
		t.Fatalf("amd-mi300x-roce-slice = %+v", amd)
	}
	bm, err := st.GetSKU(ctx, "h200-sxm-baremetal-8g")
	if err != nil {
		t.Fatal(err)
	}
	if bm.CapacityShape != "baremetal" || !bm.ExclusiveNode || !reflect.DeepEqual(bm.AllowedGPUCounts, []int{8}) || bm.GPUHourlyPriceMinor != 450 {
		t.Fatalf("h200-sxm-baremetal-8g = %+v", bm)
	}

	if _, err := st.GetSKU(ctx, "no-such-sku"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown SKU: %v", err)
	}
	// The same query inside a transaction.
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		got, err := tx.GetSKU(ctx, "h200-sxm-slice")
		if err == nil && !reflect.DeepEqual(got, h) {
			err = fmt.Errorf("tx.GetSKU = %+v, want %+v", got, h)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func TestCatalogPatchSKU(t *testing.T) {
	st, _ := catalogDB(t)
	ctx := context.Background()
	before, err := st.GetSKU(ctx, "h200-sxm-slice")
	if err != nil {
		t.Fatal(err)
	}
	rp := json.RawMessage(`{"default_slice_vm_profile":"p1","slice_vm_profiles":{"p1":{"gpu_count":1,"vcpu_count":8,"memory_mib":1024}}}`)
	var out apiv1.SKU
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		out, err = tx.PatchSKU(ctx, "h200-sxm-slice", apiv1.SKUPatch{DisplayName: catRef("H200 slice"),
			AllowedGPUCounts: []int{1, 2}, GPUHourlyPriceMinor: catRef(int64(500)), ResourceProfile: &rp})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if out.DisplayName != "H200 slice" || !reflect.DeepEqual(out.AllowedGPUCounts, []int{1, 2}) || out.GPUHourlyPriceMinor != 500 ||
		!out.Active || out.GPUsTotal != 8 || out.NetworkFabric != "infiniband" || !out.UpdatedAt.After(before.UpdatedAt) {
		t.Fatalf("patched = %+v", out)
	}
	var gotRP map[string]any
	_ = json.Unmarshal(out.ResourceProfile, &gotRP)
	if gotRP["default_slice_vm_profile"] != "p1" {
		t.Fatalf("resource_profile = %s", out.ResourceProfile)
	}
	if got, _ := st.GetSKU(ctx, "h200-sxm-slice"); !reflect.DeepEqual(got, out) {
		t.Fatalf("read back = %+v, want %+v", got, out)
	}

	// Switching a product off hides it from the active list only.
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.PatchSKU(ctx, "amd-mi300x-roce-slice", apiv1.SKUPatch{Active: catRef(false)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	active, _ := st.ListSKUs(ctx, true)
	all, _ := st.ListSKUs(ctx, false)
	if len(active) != 2 || len(all) != 3 {
		t.Fatalf("active %d, all %d SKUs", len(active), len(all))
	}

	// Unknown SKU; and the schema's own checks roll the patch back.
	err = st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.PatchSKU(ctx, "nope", apiv1.SKUPatch{Active: catRef(true)})
		return err
	})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("patch unknown SKU: %v", err)
	}
	err = st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.PatchSKU(ctx, "h200-sxm-slice", apiv1.SKUPatch{AllowedGPUCounts: []int{0, 1}, DisplayName: catRef("x")})
		return err
	})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("allowed_gpu_counts [0 1]: %v", err)
	}
	err = st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.PatchSKU(ctx, "h200-sxm-slice", apiv1.SKUPatch{GPUHourlyPriceMinor: catRef(int64(-1))})
		return err
	})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("negative price: %v", err)
	}
	if got, _ := st.GetSKU(ctx, "h200-sxm-slice"); got.DisplayName != "H200 slice" || got.GPUHourlyPriceMinor != 500 {
		t.Fatalf("failed patches changed the SKU: %+v", got)
	}
}

func TestCatalogImageLifecycle(t *testing.T) {
	st, _ := catalogDB(t)
	ctx := context.Background()
	in := testImage("debian-12-slice", 1)
	in.SizeBytes = catRef(int64(2 << 30))
	in.CompatibilityMetadata = json.RawMessage(`{"compatible_skus": ["h200-sxm-slice"]}`)
	im := createImage(t, st, in)
	if im.ID == "" || im.Slug != in.Slug || im.DigestSHA256 != catDigest(1) || !im.Active || im.IsDefault || im.RetiredAt != nil ||
		im.AcceleratorVendor != "nvidia" || im.NetworkFabric != "infiniband" || *im.SizeBytes != 2<<30 || !im.CloudInitSupported ||
		im.GuestAgentSupported || im.DriverStrategy != "preinstalled_nvidia" || im.DefaultUsername != "debian" {
		t.Fatalf("created = %+v", im)
	}

	// By slug, by id, in a transaction: the same row.
	bySlug, err := st.GetImage(ctx, in.Slug)
	if err != nil {
		t.Fatal(err)
	}
	byID, err := st.GetImage(ctx, im.ID)
	if err != nil {
		t.Fatal(err)
	}
	byIDUpper, err := st.GetImage(ctx, strings.ToUpper(im.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(bySlug, im) || !reflect.DeepEqual(byID, im) || !reflect.DeepEqual(byIDUpper, im) {
		t.Fatalf("lookups differ:\n%+v\n%+v\n%+v", bySlug, byID, im)
	}
	if err := st.InTx(ctx, func(tx *store.Tx) error {
		got, err := tx.GetImage(ctx, im.ID)
		if err == nil && got.Slug != in.Slug {
			err = fmt.Errorf("tx.GetImage = %+v", got)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"no-such-image", "00000000-0000-0000-0000-000000000000", "not a uuid'; --"} {
		if _, err := st.GetImage(ctx, key); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetImage(%q): %v", key, err)
		}
	}

	// Filters. The two seeded images are inactive vm_slice ubuntu placeholders.
	for _, c := range []struct {
		f    store.ImageFilter
		want []string
	}{
		{store.ImageFilter{}, []string{"debian-12-slice", "h200-ubuntu-24.04-gpuaas-slice", "ubuntu-24.04-gpuaas-slice"}},
		{store.ImageFilter{Target: "vm_slice", Active: catRef(true)}, []string{"debian-12-slice"}},
		{store.ImageFilter{Active: catRef(false)}, []string{"h200-ubuntu-24.04-gpuaas-slice", "ubuntu-24.04-gpuaas-slice"}},
		{store.ImageFilter{Family: "ubuntu"}, []string{"h200-ubuntu-24.04-gpuaas-slice", "ubuntu-24.04-gpuaas-slice"}},
		{store.ImageFilter{AcceleratorVendor: "nvidia"}, []string{"debian-12-slice", "h200-ubuntu-24.04-gpuaas-slice"}},
		{store.ImageFilter{AcceleratorVendor: "any"}, []string{"ubuntu-24.04-gpuaas-slice"}},
		{store.ImageFilter{NetworkFabric: "infiniband", Family: "debian"}, []string{"debian-12-slice"}},
		{store.ImageFilter{Target: "baremetal"}, nil},
	} {
		got, err := st.ListImages(ctx, c.f)
		if err != nil {
			t.Fatal(err)
		}
		var slugs []string
		for _, g := range got {
			slugs = append(slugs, g.Slug)
		}
		if !reflect.DeepEqual(slugs, c.want) {
			t.Errorf("ListImages(%+v) = %v, want %v", c.f, slugs, c.want)
		}
	}

	// Duplicate slug.
	err = st.InTx(ctx, func(tx *store.Tx) error { _, err := tx.CreateImage(ctx, testImage("debian-12-slice", 2)); return err })
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate slug: %v", err)
	}

	// Patch by slug; unset fields stay.
	p, err := patchImage(st, in.Slug, apiv1.OSImagePatch{DisplayName: catRef("Debian 12"), DigestSHA256: catRef(catDigest(3)),
		SizeBytes: catRef(int64(3 << 30)), SourceRef: catRef("https://images.example/v2.qcow2")})
	if err != nil {
		t.Fatal(err)
	}
	if p.DisplayName != "Debian 12" || p.DigestSHA256 != catDigest(3) || *p.SizeBytes != 3<<30 || p.SourceRef != "https://images.example/v2.qcow2" ||
		!p.Active || string(p.CompatibilityMetadata) != string(im.CompatibilityMetadata) || !p.UpdatedAt.After(im.UpdatedAt) {
		t.Fatalf("patched = %+v", p)
	}
	if _, err := patchImage(st, "no-such-image", apiv1.OSImagePatch{Active: catRef(false)}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("patch unknown: %v", err)
	}
	if _, err := patchImage(st, in.Slug, apiv1.OSImagePatch{DigestSHA256: catRef("ABC")}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("malformed digest reached the row: %v", err)
	}

	// Retire, idempotently: the first retirement time sticks.
	retire := func(key string) error {
		return st.InTx(ctx, func(tx *store.Tx) error { return tx.RetireImage(ctx, key) })
	}
	if err := retire(im.ID); err != nil {
		t.Fatal(err)
	}
	r1, _ := st.GetImage(ctx, im.ID)
	if r1.Active || r1.RetiredAt == nil {
		t.Fatalf("retired = %+v", r1)
	}
	time.Sleep(5 * time.Millisecond)
	if err := retire(in.Slug); err != nil {
		t.Fatal(err)
	}
	r2, _ := st.GetImage(ctx, im.ID)
	if !r2.RetiredAt.Equal(*r1.RetiredAt) || !r2.UpdatedAt.Equal(r1.UpdatedAt) || r2.Active {
		t.Fatalf("second retire changed the row: %+v then %+v", r1, r2)
	}
	if err := retire("no-such-image"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("retire unknown: %v", err)
	}
	// Reactivating clears retired_at.
	back, err := patchImage(st, im.ID, apiv1.OSImagePatch{Active: catRef(true)})
	if err != nil || !back.Active || back.RetiredAt != nil {
		t.Fatalf("reactivated = %+v %v", back, err)
	}

	// Hard delete of an image no allocation references.
	if err := st.InTx(ctx, func(tx *store.Tx) error { return tx.HardDeleteImage(ctx, im.ID) }); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetImage(ctx, in.Slug); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted image still found: %v", err)
	}
	if err := st.InTx(ctx, func(tx *store.Tx) error { return tx.HardDeleteImage(ctx, im.ID) }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second hard delete: %v", err)
	}
}

func TestCatalogHardDeleteRefusedWhenReferenced(t *testing.T) {
	st, url := catalogDB(t)
	ctx := context.Background()
	im := createImage(t, st, testImage("in-use", 7))

	conn := connect(t, url)
	var tenant, node string
	if err := conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ('acme') RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO nodes (name, region) VALUES ('n1', 'lab') RETURNING id::text`).Scan(&node); err != nil {
		t.Fatal(err)
	}
	// A released allocation still counts: the image was referenced.
	if _, err := conn.Exec(ctx, `INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id,
			os_image_id, price_snapshot, status) VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 1, 'lab', $2, $3, '{}', 'failed')`,
		tenant, node, im.ID); err != nil {
		t.Fatal(err)
	}

	err := st.InTx(ctx, func(tx *store.Tx) error { return tx.HardDeleteImage(ctx, "in-use") })
	if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "referenced by 1 allocation") {
		t.Fatalf("hard delete of a referenced image: %v", err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id,
			os_image_id, price_snapshot) VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 2, 'lab', $2, $3, '{}')`,
		tenant, node, im.ID); err != nil {
		t.Fatal(err)
	}
	err = st.InTx(ctx, func(tx *store.Tx) error { return tx.HardDeleteImage(ctx, im.ID) })
	if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "referenced by 2 allocations") {
		t.Fatalf("hard delete of a twice-referenced image: %v", err)
	}
	if got, err := st.GetImage(ctx, im.ID); err != nil || !got.Active {
		t.Fatalf("refused delete changed the image: %+v %v", got, err)
	}
	// Retiring it is the way out.
	if err := st.InTx(ctx, func(tx *store.Tx) error { return tx.RetireImage(ctx, im.ID) }); err != nil {
		t.Fatal(err)
	}
}

func TestCatalogDefaultImageIsExclusivePerTarget(t *testing.T) {
	st, _ := catalogDB(t)
	ctx := context.Background()
	defaults := func(target string) []string {
		t.Helper()
		imgs, err := st.ListImages(ctx, store.ImageFilter{Target: target})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, im := range imgs {
			if im.IsDefault {
				out = append(out, im.Slug)
			}
		}
		return out
	}
	a := testImage("slice-a", 1)
	a.IsDefault = true
	createImage(t, st, a)
	b := testImage("slice-b", 2)
	b.IsDefault = true
	createImage(t, st, b)
	if got := defaults("vm_slice"); !reflect.DeepEqual(got, []string{"slice-b"}) {
		t.Fatalf("defaults after two creates = %v", got)
	}
	// Another target has its own default.
	bm := testImage("bm-ubuntu", 3)
	bm.Target, bm.ImageFormat, bm.SourceType, bm.SourceRef, bm.IsDefault = "baremetal", "maas", "maas", "ubuntu/noble", true
	createImage(t, st, bm)
	if got := defaults("vm_slice"); !reflect.DeepEqual(got, []string{"slice-b"}) {
		t.Fatalf("vm_slice defaults after a baremetal default = %v", got)
	}
	if got := defaults("baremetal"); !reflect.DeepEqual(got, []string{"bm-ubuntu"}) {
		t.Fatalf("baremetal defaults = %v", got)
	}
	// Patching moves the marker; clearing it leaves none; retiring drops it.
	if _, err := patchImage(st, "slice-a", apiv1.OSImagePatch{IsDefault: catRef(true)}); err != nil {
		t.Fatal(err)
	}
	if got := defaults("vm_slice"); !reflect.DeepEqual(got, []string{"slice-a"}) {
		t.Fatalf("defaults after patch = %v", got)
	}
	if _, err := patchImage(st, "slice-a", apiv1.OSImagePatch{IsDefault: catRef(false)}); err != nil {
		t.Fatal(err)
	}
	if got := defaults("vm_slice"); got != nil {
		t.Fatalf("defaults after clearing = %v", got)
	}
	if err := st.InTx(ctx, func(tx *store.Tx) error { return tx.RetireImage(ctx, "bm-ubuntu") }); err != nil {
		t.Fatal(err)
	}
	if got := defaults("baremetal"); got != nil {
		t.Fatalf("retired image kept its default marker: %v", got)
	}

	// Concurrent default changes still leave exactly one default.
	slugs := []string{"slice-a", "slice-b"}
	for i := range 4 {
		s := testImage(fmt.Sprintf("slice-c%d", i), 10+i)
		createImage(t, st, s)
		slugs = append(slugs, s.Slug)
	}
	for round := range 10 {
		var wg sync.WaitGroup
		errs := make(chan error, len(slugs))
		for _, s := range slugs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := patchImage(st, s, apiv1.OSImagePatch{IsDefault: catRef(true)})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if got := defaults("vm_slice"); len(got) != 1 {
			t.Fatalf("round %d: %d defaults after concurrent patches: %v", round, len(got), got)
		}
	}
}

func TestCatalogDatabaseRefusesActiveImageWithoutDigest(t *testing.T) {
	st, url := catalogDB(t)
	ctx := context.Background()

	// Through the store: an active image with no digest, or a malformed one.
	noDigest := testImage("no-digest", 1)
	noDigest.DigestSHA256 = ""
	err := st.InTx(ctx, func(tx *store.Tx) error { _, err := tx.CreateImage(ctx, noDigest); return err })
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("active image without digest: %v", err)
	}
	upper := testImage("upper-digest", 1)
	upper.DigestSHA256 = strings.ToUpper(catDigest(0xabc))
	err = st.InTx(ctx, func(tx *store.Tx) error { _, err := tx.CreateImage(ctx, upper); return err })
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("uppercase digest: %v", err)
	}
	// An inactive placeholder without a digest is allowed, but cannot be activated.
	noDigest.Active = false
	ph := createImage(t, st, noDigest)
	if ph.Active || ph.DigestSHA256 != "" {
		t.Fatalf("placeholder = %+v", ph)
	}
	if _, err := patchImage(st, ph.ID, apiv1.OSImagePatch{Active: catRef(true)}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("activating a placeholder: %v", err)
	}
	if got, _ := st.GetImage(ctx, ph.ID); got.Active {
		t.Fatal("placeholder became active")
	}

	// Straight SQL, bypassing the store: the CHECK constraint itself refuses.
	conn := connect(t, url)
	_, err = conn.Exec(ctx, `INSERT INTO os_images (slug, display_name, version, target, family, architecture, image_format,
		source_type, source_ref, default_username, driver_strategy, active)
		VALUES ('raw-sql', 'x', '1', 'vm_slice', 'debian', 'amd64', 'qcow2', 'http', 'https://x/y', 'debian', 'none', true)`)
	if err == nil || !strings.Contains(err.Error(), "check constraint") {
		t.Fatalf("raw insert of an active image without digest: %v", err)
	}
	_, err = conn.Exec(ctx, `UPDATE os_images SET active = true WHERE slug = 'ubuntu-24.04-gpuaas-slice'`)
	if err == nil || !strings.Contains(err.Error(), "check constraint") {
		t.Fatalf("raw activation of the seeded placeholder: %v", err)
	}
}
