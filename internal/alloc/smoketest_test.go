package alloc_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// An image becomes active, a SKU's default or a canary only once a smoke test of its current
// digest passed: a validation allocation on the chosen node that reached active. A running or
// failed test does not count, nor one of a digest the image no longer has; the database
// refuses the pointer whatever the caller.
func TestActivationAndDefaultRefusedWithoutAPassedSmokeTest(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	b.tx(func(tx *store.Tx) error {
		_, err := tx.CreateImage(b.ctx, apiv1.OSImage{Slug: "pending-v2", DisplayName: "v2", Version: "2", Target: "vm_slice",
			Family: "debian", Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://images.example/v2",
			DigestSHA256: strings.Repeat("12", 32), DefaultUsername: "debian", DriverStrategy: "none"})
		return err
	})
	refused := func(what string) {
		t.Helper()
		err := b.st.InTx(b.ctx, func(tx *store.Tx) error { _, err := tx.ActivateImage(b.ctx, "pending-v2"); return err })
		if !errors.Is(err, store.ErrNoPassedSmokeTest) {
			t.Fatalf("%s: activate = %v", what, err)
		}
		err = b.st.InTx(b.ctx, func(tx *store.Tx) error { return tx.SetDefaultImage(b.ctx, "h200-sxm-slice", "pending-v2") })
		if !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("%s: default pointer = %v", what, err)
		}
	}
	refused("no test")
	// An image registered active (the manual bootstrap path) without a passed smoke test
	// cannot become the default either.
	err := b.st.InTx(b.ctx, func(tx *store.Tx) error { return tx.SetDefaultImage(b.ctx, "h200-sxm-slice", "test-slice-image") })
	if err == nil || !strings.Contains(err.Error(), "no passed smoke test") {
		t.Fatalf("untested active image as default = %v", err)
	}

	// A pending image is what a smoke test boots; tenants cannot name it.
	if _, _, err := b.svc.Create(b.ctx, b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1, Image: "pending-v2"}, ""); err == nil {
		t.Fatal("a tenant allocated a pending image")
	}
	var st apiv1.ImageSmokeTest
	st, err = b.svc.StartSmokeTest(b.ctx, b.admin, "pending-v2", "n1")
	if err != nil || st.Status != "running" || st.Node != "n1" || !st.Current {
		t.Fatalf("smoke test = %+v, %v", st, err)
	}
	if slug, _, node := b.allocImageNode(st.AllocationID); slug != "pending-v2" || node != n.ID {
		t.Fatalf("validation allocation boots %s on %s", slug, node)
	}
	refused("running")
	if err := b.svc.MarkFailed(b.ctx, st.AllocationID, "readiness: no SSH within 120s"); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.st.SmokeTest(b.ctx, st.ID); got.Status != "failed" || !strings.Contains(got.FailureReason, "readiness") {
		t.Fatalf("after failure: %+v", got)
	}
	refused("failed")

	passed := b.passSmokeTest("pending-v2", "n1")
	if got, _ := b.st.SmokeTest(b.ctx, passed.ID); got.Status != "passed" {
		t.Fatalf("after active: %+v", got)
	}
	var im apiv1.OSImage
	b.tx(func(tx *store.Tx) error { var err error; im, err = tx.ActivateImage(b.ctx, "pending-v2"); return err })
	if !im.Active {
		t.Fatalf("activated %+v", im)
	}
	b.tx(func(tx *store.Tx) error { return tx.SetDefaultImage(b.ctx, "h200-sxm-slice", "pending-v2") })

	// The default's digest cannot change under it (its test covered the old one).
	other := strings.Repeat("34", 32)
	err = b.st.InTx(b.ctx, func(tx *store.Tx) error {
		_, err := tx.PatchImage(b.ctx, "pending-v2", apiv1.OSImagePatch{DigestSHA256: &other})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "default or canary image") {
		t.Fatalf("digest change under the pointer = %v", err)
	}
	tests, err := b.st.SmokeTests(b.ctx, "pending-v2")
	if err != nil || len(tests) != 2 {
		t.Fatalf("smoke tests %+v %v", tests, err)
	}
	// A retired image cannot be smoke-tested; an unknown node is not found.
	if _, err := b.svc.StartSmokeTest(b.ctx, b.admin, "pending-v2", "nope"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("unknown node: %v", err)
	}
}
