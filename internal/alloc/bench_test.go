package alloc_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
)

// BenchmarkCreateRelease measures one reserve transaction (candidate SQL, ranking, SKIP
// LOCKED, claims, outbox, audit) plus its release, on real PostgreSQL with 16 nodes x 8 slots,
// from parallel clients.
func BenchmarkCreateRelease(b *testing.B) {
	ctx := context.Background()
	st, err := store.Open(ctx, pgtest.NewDatabase(b), store.Options{MaxConns: 16, AllowUntestedImages: true})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	var tenant apiv1.Tenant
	err = st.InTx(ctx, func(tx *store.Tx) error {
		if tenant, err = tx.CreateTenant(ctx, "bench"); err != nil {
			return err
		}
		if _, err := tx.CreateImage(ctx, apiv1.OSImage{Slug: "bench", DisplayName: "b", Version: "1", Target: "vm_slice", Family: "debian",
			Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://x/y", DigestSHA256: fmt.Sprintf("%064x", 1),
			DefaultUsername: "d", DriverStrategy: "none", Active: true}); err != nil {
			return err
		}
		for i := 0; i < 16; i++ {
			n, err := tx.CreateNode(ctx, apiv1.NodeCreate{Name: fmt.Sprintf("b%02d", i), Region: "lab", SliceSKU: "h200-sxm-slice"})
			if err != nil {
				return err
			}
			if _, err := tx.ApplySlots(ctx, n.ID, fixtures.H200SlotMap(i), false); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	svc := alloc.New(st, alloc.Config{})
	actor := alloc.Actor{TokenID: "bench", Name: "bench", Role: "tenant", TenantID: tenant.ID}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			a, _, err := svc.Create(ctx, actor, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, "")
			if err != nil {
				continue // all slots busy under contention: counted as an iteration, like a real refusal
			}
			if _, err := svc.Release(ctx, actor, a.ID); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
