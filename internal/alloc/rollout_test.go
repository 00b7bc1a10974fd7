package alloc_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// canaryImage registers a second active image for the slice SKU.
func (b *testBundle) canaryImage(slug string, n int) {
	b.t.Helper()
	b.tx(func(tx *store.Tx) error {
		_, err := tx.CreateImage(b.ctx, apiv1.OSImage{Slug: slug, DisplayName: slug, Version: "2", Target: "vm_slice",
			Family: "debian", Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://images.example/" + slug,
			DigestSHA256: fmt.Sprintf("%064x", n), DefaultUsername: "debian", DriverStrategy: "none", Active: true})
		return err
	})
}

// passSmokeTest smoke-tests image on node through the service and drives its validation
// allocation to active, as the host's provisioning result would.
func (b *testBundle) passSmokeTest(image, node string) apiv1.ImageSmokeTest {
	b.t.Helper()
	st, err := b.svc.StartSmokeTest(b.ctx, b.admin, image, node)
	if err != nil {
		b.t.Fatalf("smoke test of %s on %s: %v", image, node, err)
	}
	if err := b.svc.MarkProvisioning(b.ctx, st.AllocationID); err != nil {
		b.t.Fatal(err)
	}
	if err := b.svc.MarkActive(b.ctx, st.AllocationID); err != nil {
		b.t.Fatal(err)
	}
	return st
}

// allocImage reads the image an allocation recorded: its os_image_id (as a slug) and the
// slug in its image snapshot.
func (b *testBundle) allocImage(id string) (string, string) {
	slug, snap, _ := b.allocImageNode(id)
	return slug, snap
}

// allocImageNode is allocImage with the allocation's node.
func (b *testBundle) allocImageNode(id string) (string, string, string) {
	b.t.Helper()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	var slug, snap, node string
	if err := conn.QueryRow(b.ctx, `SELECT i.slug, coalesce(t.image_snapshot, a.image_snapshot)->>'slug', a.node_id::text FROM allocations a
		JOIN os_images i ON i.id = a.os_image_id LEFT JOIN allocation_snapshots x ON x.allocation_id = a.id
		LEFT JOIN allocation_terms t ON t.id = x.terms_id WHERE a.id = $1`, id).Scan(&slug, &snap, &node); err != nil {
		b.t.Fatal(err)
	}
	return slug, snap, node
}

// A canary rollout gives its image to exactly the nodes it includes: all nodes of a named
// region, and the share of the others whose bucket falls below it; every other node keeps
// the default. Rolling back ends the canary without touching an allocation's recorded image;
// new allocations get the default again, and the canary image, once retired, cannot be
// named for a new allocation while the allocations that booted it keep it.
func TestCanaryShareIsRespectedByPlacementAndRollbackOnlyMovesThePointer(t *testing.T) {
	b := setup(t)
	b.canaryImage("slice-v2", 2)
	var nodes []apiv1.Node
	for i := 0; i < 10; i++ {
		region := "lab"
		if i < 2 {
			region = "edge"
		}
		nodes = append(nodes, b.addNode(fmt.Sprintf("n%02d", i), i+1, withRegion(region)))
	}
	var ro apiv1.ImageRollout
	b.tx(func(tx *store.Tx) error {
		if _, err := tx.StartRollout(b.ctx, "h200-sxm-slice", apiv1.ImageRolloutCreate{Image: "slice-v2", SharePercent: 50}); err == nil {
			t.Error("a rollout started on a SKU without a default")
		}
		return nil
	})
	// Both images pass a smoke test on a node of their own (its free slots are too few for
	// the whole-node allocations below).
	b.addNode("smoke", 20)
	b.passSmokeTest("test-slice-image", "smoke")
	b.passSmokeTest("slice-v2", "smoke")
	b.tx(func(tx *store.Tx) error { return tx.SetDefaultImage(b.ctx, "h200-sxm-slice", "test-slice-image") })
	b.tx(func(tx *store.Tx) error {
		var err error
		ro, err = tx.StartRollout(b.ctx, "h200-sxm-slice", apiv1.ImageRolloutCreate{Image: "slice-v2", SharePercent: 50, Regions: []string{"edge"}})
		return err
	})
	region := map[string]string{}
	for _, n := range nodes {
		region[n.ID] = n.Region
	}
	// One whole node (8 GPUs) per allocation: every node gets one.
	canaryNodes := 0
	var allocs []apiv1.Allocation
	for range nodes {
		a := b.mustCreate(8)
		allocs = append(allocs, a)
		_, _, node := b.allocImageNode(a.ID)
		want := "test-slice-image"
		if region[node] == "edge" || store.CanaryBucket(ro.ID, node) < 50 {
			want = "slice-v2"
			canaryNodes++
		}
		if slug, snap := b.allocImage(a.ID); slug != want || snap != want {
			t.Fatalf("allocation on node %s (region %s, bucket %d) boots %s (snapshot %s), want %s",
				node, region[node], store.CanaryBucket(ro.ID, node), slug, snap, want)
		}
	}
	if canaryNodes < 2 {
		t.Fatalf("canary on %d of %d nodes: at least the two edge nodes expected", canaryNodes, len(nodes))
	}
	st, err := b.st.ImageRolloutStatus(b.ctx, "h200-sxm-slice")
	if err != nil || st.Canary == nil || st.Canary.ID != ro.ID || st.DefaultImage != "test-slice-image" {
		t.Fatalf("status %+v %v", st, err)
	}
	total := 0
	for _, o := range st.Outcomes {
		total += o.Allocations
	}
	if total != len(nodes) {
		t.Fatalf("outcomes count %d allocations, want %d: %+v", total, len(nodes), st.Outcomes)
	}

	// The canary image cannot be retired while the canary runs.
	if err := b.st.InTx(b.ctx, func(tx *store.Tx) error { return tx.RetireImage(b.ctx, "slice-v2") }); err == nil ||
		!strings.Contains(err.Error(), "promote or roll back first") {
		t.Fatalf("retiring the canary image = %v", err)
	}
	b.tx(func(tx *store.Tx) error {
		r, err := tx.RollBack(b.ctx, "h200-sxm-slice")
		if err == nil && r.Status != "rolled_back" {
			t.Errorf("rolled back rollout %+v", r)
		}
		return err
	})
	before := map[string]string{}
	for _, a := range allocs {
		before[a.ID], _ = b.allocImage(a.ID)
	}
	b.tx(func(tx *store.Tx) error { return tx.RetireImage(b.ctx, "slice-v2") })
	for _, a := range allocs {
		if slug, snap := b.allocImage(a.ID); slug != before[a.ID] || snap != before[a.ID] {
			t.Fatalf("allocation %s image moved from %s to %s/%s", a.ID, before[a.ID], slug, snap)
		}
	}
	// New allocations boot the default, even in the region the canary named, and the retired
	// image cannot be named.
	b.addNode("n10", 11, withRegion("edge"))
	if slug, _ := b.allocImage(b.mustCreate(8).ID); slug != "test-slice-image" {
		t.Fatalf("after rollback a new allocation boots %s", slug)
	}
	_, _, err = b.svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 8, Image: "slice-v2"}, "")
	var ae *apiv1.Error
	if !errors.As(err, &ae) || !strings.Contains(ae.Message, "slice-v2") {
		t.Fatalf("create naming the retired image = %v", err)
	}
}
