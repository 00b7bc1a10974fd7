package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, store.MigrateForTest)) }

func open(t *testing.T) (*store.Store, string) {
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

func TestMigrateIsIdempotent(t *testing.T) {
	_, url := open(t)
	v, err := store.Migrate(context.Background(), url)
	files, _ := filepath.Glob("migrations/*.sql") // one version per migration file
	if err != nil || int(v) != len(files) || len(files) < 8 {
		t.Fatalf("re-migrate: version %d, %v; want %d (the migration files)", v, err, len(files))
	}
}

func TestSeededCatalogMatchesSeed002(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	sl, err := st.GetSKU(ctx, "h200-sxm-slice")
	if err != nil {
		t.Fatal(err)
	}
	if sl.CapacityShape != "gpu_slice" || !reflect.DeepEqual(sl.AllowedGPUCounts, []int{1, 2, 4, 8}) ||
		sl.GPUHourlyPriceMinor != 450 || sl.GPUsTotal != 8 || sl.DisplayName != "NVIDIA H200 GPU VM" || sl.Vendor != "NVIDIA" {
		t.Fatalf("h200-sxm-slice = %+v", sl)
	}
	var rp struct {
		Fabric   string `json:"fabric"`
		Unit     int    `json:"slice_unit_gpu_count"`
		Default  string `json:"default_slice_vm_profile"`
		Profiles map[string]struct {
			GPUs, VCPU, Mem int
		} `json:"slice_vm_profiles"`
	}
	if err := json.Unmarshal(sl.ResourceProfile, &rp); err != nil {
		t.Fatal(err)
	}
	var raw map[string]map[string]map[string]any
	_ = json.Unmarshal(sl.ResourceProfile, &raw)
	want := map[string][3]float64{
		"h200_1g_12c_64g": {1, 12, 65536}, "h200_1g_24c_64g": {1, 24, 65536}, "h200_2g_48c_128g": {2, 48, 131072},
		"h200_4g_96c_256g": {4, 96, 262144}, "h200_8g_192c_512g": {8, 192, 524288},
	}
	if rp.Fabric != "ib" || rp.Unit != 1 || rp.Default != "h200_1g_24c_64g" || len(raw["slice_vm_profiles"]) != len(want) {
		t.Fatalf("resource_profile = %s", sl.ResourceProfile)
	}
	for name, w := range want {
		p := raw["slice_vm_profiles"][name]
		if p["gpu_count"] != w[0] || p["vcpu_count"] != w[1] || p["memory_mib"] != w[2] {
			t.Fatalf("profile %s = %v", name, p)
		}
	}
	bm, err := st.GetSKU(ctx, "h200-sxm-baremetal-8g")
	if err != nil || bm.CapacityShape != "baremetal" || !bm.ExclusiveNode || bm.GPUsTotal != 8 {
		t.Fatalf("baremetal = %+v %v", bm, err)
	}
	amd, err := st.GetSKU(ctx, "amd-mi300x-roce-slice")
	if err != nil || amd.NetworkFabric != "roce" || !reflect.DeepEqual(amd.AllowedGPUCounts, []int{1, 2, 4}) {
		t.Fatalf("amd = %+v %v", amd, err)
	}
	imgs, err := st.ListImages(ctx, store.ImageFilter{Target: "vm_slice"})
	if err != nil || len(imgs) != 2 {
		t.Fatalf("seeded images = %d %v", len(imgs), err)
	}
	for _, im := range imgs {
		if im.Active || im.DigestSHA256 != "" {
			t.Fatalf("seeded placeholder %s must be inactive without a digest: %+v", im.Slug, im)
		}
	}
}

func TestImageWithoutDigestCannotBeActive(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	err := st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.PatchImage(ctx, "ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{Active: ptr(true)})
		return err
	})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("activating a digest-less image: %v", err)
	}
	digest := "5d41402abc4b2a76b9719d911017c592" + "5d41402abc4b2a76b9719d911017c592"
	err = st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.PatchImage(ctx, "ubuntu-24.04-gpuaas-slice", apiv1.OSImagePatch{DigestSHA256: &digest, Active: ptr(true), IsDefault: ptr(true)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := st.ResolveSliceImage(ctx, "h200-sxm-slice", "")
	if err != nil || img.Slug != "ubuntu-24.04-gpuaas-slice" {
		t.Fatalf("resolve = %+v %v", img, err)
	}
	// Hard delete is refused... only for referenced images; this one is unreferenced.
	if err := st.InTx(ctx, func(tx *store.Tx) error { return tx.HardDeleteImage(ctx, "h200-ubuntu-24.04-gpuaas-slice") }); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetImage(ctx, "h200-ubuntu-24.04-gpuaas-slice"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted image still found: %v", err)
	}
}

func TestInvariantsHoldOnEmptyDatabase(t *testing.T) {
	st, _ := open(t)
	v, err := st.Invariants(context.Background())
	if err != nil || len(v) != 0 {
		t.Fatalf("invariants = %v %v", v, err)
	}
}

func ptr[T any](v T) *T { return &v }

// connect is a plain connection to the test database (for what the store has no call for:
// raw SQL, a second session), closed when the test ends.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
