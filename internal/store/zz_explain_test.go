package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/gpuaas/gpuaas/internal/store"
)

func TestZZExplainCreate(t *testing.T) {
	b := snapshotsSetup(t, "zz-explain", 63)
	ctx := context.Background()
	na := allocationContent(b, b.slotIDs[:2])
	js := func(v any) []byte { j, _ := json.Marshal(v); return j }
	_ = b.create(t, na, b.slotIDs[:2])
	for _, form := range []string{"old", "new"} {
		for i := 0; i < 4; i++ {
			id := store.NewID()
			var sql string
			if form == "old" {
				sql = `EXPLAIN (ANALYZE, TIMING ON) INSERT INTO allocations (id, tenant_id, sku, capacity_shape, gpus_total, region, node_id,
			profile_name, resolved_profile, os_image_id, image_snapshot, price_snapshot, usage_snapshot,
			ssh_public_keys, idempotency_key, request_hash, created_at, updated_at, reservation_id)
		VALUES ($16,$1,$2,$3,$4,coalesce(nullif($5::text, ''), (SELECT region FROM nodes WHERE id = $6)),$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,
			clock_timestamp(), clock_timestamp(), $17::uuid)`
			} else {
				sql = `EXPLAIN (ANALYZE, TIMING ON) ` + store.AllocationInsertSQLForTest
			}
			tx, err := b.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := tx.Query(ctx, sql, na.TenantID, na.SKU, na.CapacityShape, na.GPUs, na.Region, na.NodeID, na.ProfileName,
				js(na.ResolvedProfile), nil, js(na.ImageSnapshot), js(na.PriceSnapshot), js(na.UsageSnapshot), na.SSHPublicKeys,
				nil, "", id, nil)
			if err != nil {
				t.Fatal(err)
			}
			var out string
			for rows.Next() {
				var l string
				_ = rows.Scan(&l)
				out += l + "\n"
			}
			rows.Close()
			_ = tx.Rollback(ctx)
			if i >= 2 {
				fmt.Printf("---- %s %d\n%s", form, i, out)
			}
		}
	}
}
