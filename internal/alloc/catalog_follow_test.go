package alloc_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// Every create reads the catalog as it stands: a repriced SKU, a new default image, that image
// switched off and retired, and a disabled SKU are followed by the next create on each of two replicas (two
// services with their own connection pools on one database), each of which created before the
// change. Anything that remembers the catalog between creates (a cache) must keep this true.
func TestCreatesFollowTheCatalogOnEveryReplica(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	b.refreshCapacity()
	st2, err := store.Open(b.ctx, b.url, store.Options{MaxConns: 4, AllowUntestedImages: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st2.Close)
	replicas := map[string]*alloc.Service{"A": b.svc, "B": alloc.New(st2, alloc.Config{Now: b.clock.Now})}
	conn := connectTo(b)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(b.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// createOn creates on each replica and releases at once; check sees each answer.
	createOn := func(what string, check func(apiv1.Allocation, error) string) {
		t.Helper()
		for _, name := range []string{"A", "B"} {
			svc := replicas[name]
			a, _, err := svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2}, "")
			if msg := check(a, err); msg != "" {
				t.Fatalf("%s, replica %s: %s", what, name, msg)
			}
			if err == nil {
				if _, err := svc.Release(b.ctx, b.tenant, a.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	booted := func(slug string, price int64) func(apiv1.Allocation, error) string {
		return func(a apiv1.Allocation, err error) string {
			if err != nil {
				return err.Error()
			}
			if a.Image == nil || a.Image.Slug != slug || a.Price.GPUHourlyPriceMinor != price {
				return fmt.Sprintf("created with image %+v at %d, want %s at %d", a.Image, a.Price.GPUHourlyPriceMinor, slug, price)
			}
			return ""
		}
	}
	var price int64
	if err := conn.QueryRow(b.ctx, `SELECT gpu_hourly_price_minor FROM sku_catalog WHERE sku = 'h200-sxm-slice'`).Scan(&price); err != nil {
		t.Fatal(err)
	}
	createOn("before any change", booted("test-slice-image", price))

	exec(`UPDATE sku_catalog SET gpu_hourly_price_minor = gpu_hourly_price_minor + 100 WHERE sku = 'h200-sxm-slice'`)
	createOn("after a price change", booted("test-slice-image", price+100))

	b.tx(func(tx *store.Tx) error {
		_, err := tx.CreateImage(b.ctx, apiv1.OSImage{Slug: "newer-default", DisplayName: "newer", Version: "2", Target: "vm_slice",
			Family: "debian", Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://images.example/newer.qcow2",
			DigestSHA256: strings.Repeat("cd", 32), DefaultUsername: "debian", DriverStrategy: "none", Active: true, IsDefault: true})
		return err
	})
	createOn("after a new default image", booted("newer-default", price+100))

	exec(`UPDATE os_images SET active = false, retired_at = now() WHERE slug = 'newer-default'`)
	createOn("after the default image was switched off and retired", booted("test-slice-image", price+100))

	exec(`UPDATE sku_catalog SET active = false WHERE sku = 'h200-sxm-slice'`)
	createOn("after the SKU was disabled", func(a apiv1.Allocation, err error) string {
		var ae *apiv1.Error
		if !errors.As(err, &ae) || ae.Code != apiv1.CodeSKUUnavailable || ae.Details["reason"] != apiv1.ReasonSKUInactive {
			return fmt.Sprintf("create answered %q, %v; want sku_unavailable (sku_inactive)", a.ID, err)
		}
		return ""
	})
}
