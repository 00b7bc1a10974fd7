package alloc

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

// ValidationTenant owns the allocations that smoke-test images: they never belong to a
// customer and are billed to nobody (price 0).
const ValidationTenant = "gpuaas-image-validation"

// StartSmokeTest smoke-tests an image on a node: it reserves one free slot of the node's
// slice SKU for a validation allocation booting the image (pending images included; a
// retired one or one without a digest is refused) and queues its provisioning task, the
// same task any slice gets: the host checks the digest (and signature, when the SKU requires
// one), writes the disk, boots and waits for readiness. The test passes when that allocation
// reaches active; release it afterwards (gpuaasctl images test --wait does).
func (s *Service) StartSmokeTest(ctx context.Context, actor Actor, image, node string) (apiv1.ImageSmokeTest, error) {
	var testID, nodeID string
	err := s.st.InTx(ctx, func(tx *store.Tx) error {
		im, err := tx.GetImage(ctx, image)
		if errors.Is(err, store.ErrNotFound) {
			return &apiv1.Error{Code: apiv1.CodeNotFound, Message: fmt.Sprintf("image %q not found", image)}
		}
		if err != nil {
			return err
		}
		switch {
		case im.Target != "vm_slice":
			return invalid("image %s is a %s image; smoke tests boot vm_slice images", im.Slug, im.Target)
		case im.DigestSHA256 == "":
			return invalid("image %s has no digest_sha256: record the artifact's digest first", im.Slug)
		case im.RetiredAt != nil:
			return invalid("image %s is retired", im.Slug)
		}
		n, err := tx.GetNode(ctx, node)
		if errors.Is(err, store.ErrNotFound) {
			return &apiv1.Error{Code: apiv1.CodeNotFound, Message: fmt.Sprintf("node %q not found", node)}
		}
		if err != nil {
			return err
		}
		if n.SliceSKU == "" {
			return invalid("node %s sells no slices (no slice SKU)", n.Name)
		}
		sku, err := tx.GetSKU(ctx, n.SliceSKU)
		if err != nil {
			return err
		}
		if sku.RequiresSignedImages && im.Signature == "" {
			return invalid("SKU %s requires signed images and image %s is unsigned", sku.SKU, im.Slug)
		}
		tenant, err := tx.EnsureTenant(ctx, ValidationTenant)
		if err != nil {
			return err
		}
		if len(sku.AllowedGPUCounts) == 0 {
			return invalid("SKU %s sells no GPU count", sku.SKU)
		}
		gpus := slices.Min(sku.AllowedGPUCounts) // the smallest slice the SKU sells
		r := request{sku: sku, gpus: gpus, tenant: tenant, policy: policyFor(sku, gpus)}
		cands, err := tx.SliceCandidates(ctx, s.query(r))
		if err != nil {
			return err
		}
		var free []string
		for _, c := range cands {
			if c.NodeID == n.ID {
				free = append(free, c.SlotID)
			}
		}
		if len(free) < gpus {
			return unavailable(apiv1.ReasonNoCapacity, fmt.Sprintf(
				"node %s has no free %s slot for a smoke test (it must be schedulable: active, heartbeating, an available slot)", n.Name, sku.SKU), nil)
		}
		claims, slotIDs, _, err := lockChoice(ctx, tx, n.ID, free[:gpus], free[gpus:], "")
		if err != nil {
			if errors.Is(err, errLostRace) {
				return unavailable(apiv1.ReasonNoCapacity, "the node's free slots were just taken; retry", map[string]any{"retryable": true})
			}
			return err
		}
		profile, err := ResolveProfile(sku, gpus, "")
		if err != nil {
			return invalid("%v", err)
		}
		price := apiv1.Price{Currency: sku.Currency, GPUs: gpus, CapacityShape: sku.CapacityShape}
		img := store.ResolvedImage{ID: im.ID, Slug: im.Slug, SourceType: im.SourceType, SourceRef: im.SourceRef,
			DigestSHA256: im.DigestSHA256, ImageFormat: im.ImageFormat, Username: im.DefaultUsername,
			Signature: im.Signature, SignatureRequired: sku.RequiresSignedImages}
		na := store.NewAllocation{TenantID: tenant, SKU: sku.SKU, CapacityShape: sku.CapacityShape, GPUs: gpus, Region: n.Region,
			NodeID: n.ID, ProfileName: profile.Name, ResolvedProfile: profile, OSImageID: im.ID, ImageSnapshot: img,
			PriceSnapshot: price, UsageSnapshot: usage(r, price, n.ID, slotIDs)}
		rec := actor.audit("os_image.smoke_test", "allocation", "", map[string]any{
			"image": im.Slug, "image_id": im.ID, "digest_sha256": im.DigestSHA256, "node": n.Name, "slots": slotIDs})
		na.Audit = &rec
		if s.planner != nil {
			na.ID = store.NewID()
			if na.Task, err = s.planner.ProvisionTask(planOf(na, claims)); err != nil {
				return err
			}
		}
		written, _, err := tx.InsertAllocationRecord(ctx, na, claims)
		if err != nil {
			return err
		}
		nodeID = n.ID
		testID, err = tx.InsertSmokeTest(ctx, im.ID, im.DigestSHA256, written.ID, n.ID, actor.Name)
		return err
	})
	if err != nil {
		return apiv1.ImageSmokeTest{}, err
	}
	if s.planner != nil {
		s.planner.TaskQueued(nodeID)
	}
	return s.st.SmokeTest(ctx, testID)
}
