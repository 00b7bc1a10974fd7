package api_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/imagesig"
)

// The catalog records an image signature only when a trusted publisher key verifies it for
// the image's digest; a SKU's signed-images requirement is patched and audited.
func TestCatalogAPIImageSignatures(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_, rogue, _ := ed25519.GenerateKey(rand.Reader)
	c := newCatalogAPI(t, imagesig.Key{Name: "release", Public: base64.StdEncoding.EncodeToString(pub)})

	im := apiImage("signed", 7)
	im.Signature = imagesig.Sign(rogue, im.DigestSHA256)
	c.fails("POST", "/api/v1/admin/os-images", im, 400, "does not verify against any trusted publisher key")
	im.Signature = "c2hvcnQ="
	c.fails("POST", "/api/v1/admin/os-images", im, 400, "signature is not 64 bytes")
	im.Signature = imagesig.Sign(priv, im.DigestSHA256)
	var out apiv1.OSImage
	c.ok("POST", "/api/v1/admin/os-images", im, 201, &out)
	if out.Signature != im.Signature {
		t.Fatalf("stored signature %q", out.Signature)
	}
	// A signature for another digest is refused on patch too.
	other := imagesig.Sign(priv, apiImage("x", 8).DigestSHA256)
	c.fails("PATCH", "/api/v1/admin/os-images/signed", apiv1.OSImagePatch{Signature: &other}, 400, "does not verify")

	yes := true
	var sku apiv1.SKU
	c.ok("PATCH", "/api/v1/admin/skus/h200-sxm-slice", apiv1.SKUPatch{RequiresSignedImages: &yes}, 200, &sku)
	if !sku.RequiresSignedImages {
		t.Fatalf("sku %+v", sku)
	}
	if len(c.audit("sku.patch")) != 1 {
		t.Fatal("sku patch not audited")
	}
}
