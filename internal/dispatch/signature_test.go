package dispatch_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// A SKU that requires signed images resolves only signed images (an unsigned one is "no
// image"), and the provisioning task of its allocation carries the signature, the
// requirement and the controller's trusted keys inside the task's own signature, so the
// host checks the image against keys it got from the controller.
func TestSignedImageRequirementReachesTheHost(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	keys := []imagesig.Key{{Name: "release", Public: base64.StdEncoding.EncodeToString(pub)}}
	w := setup(t, dispatch.Config{ImageKeys: keys})
	require := true
	if err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
		_, err := tx.PatchSKU(w.ctx, "h200-sxm-slice", apiv1.SKUPatch{RequiresSignedImages: &require})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, _, err := w.svc.Create(w.ctx, w.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1}, "")
	var ae *apiv1.Error
	if !errors.As(err, &ae) || ae.Code != apiv1.CodeSKUUnavailable || !strings.Contains(ae.Message, "no active vm_slice image") {
		t.Fatalf("create with only an unsigned image = %v", err)
	}

	digest := strings.Repeat("cd", 32) // the world's image
	sig := imagesig.Sign(priv, digest)
	if err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
		_, err := tx.PatchImage(w.ctx, "img", apiv1.OSImagePatch{Signature: &sig})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	a := w.allocate(1)
	env := w.poll(time.Second)
	if env == nil || env.Type != task.TypeVMProvision {
		t.Fatalf("envelope = %+v", env)
	}
	p, err := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(env)
	if err != nil {
		t.Fatal(err)
	}
	plan := p.(*task.VMProvision)
	if plan.AllocationID != a.ID || !plan.Image.SignatureRequired || plan.Image.Signature != sig || len(plan.ImageKeys) != 1 {
		t.Fatalf("plan image %+v keys %v", plan.Image, plan.ImageKeys)
	}
	if name, err := imagesig.Verify(plan.ImageKeys, plan.Image.DigestSHA256, plan.Image.Signature); err != nil || name != "release" {
		t.Fatalf("the host's check on the delivered plan: %q %v", name, err)
	}
	// A new digest without a new signature drops the old one: the image is unsigned again.
	other := strings.Repeat("ef", 32)
	if err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
		im, err := tx.PatchImage(w.ctx, "img", apiv1.OSImagePatch{DigestSHA256: &other})
		if err == nil && im.Signature != "" {
			t.Errorf("signature kept across a digest change: %q", im.Signature)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
