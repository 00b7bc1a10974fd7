package slicevm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/imagecache"
)

func imageArtifact(t *testing.T, dir, name string, n int) (string, string) {
	t.Helper()
	b := make([]byte, n)
	copy(b, name)
	p := filepath.Join(dir, name+".qcow2")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return "file://" + p, hex.EncodeToString(sum[:])
}

// The host's image cache under a budget of one image never evicts the image a live slice
// was written from: the slice directory the provision made names it (pinImage, the call
// Provision makes before fetching) until release removes that directory. The live set here
// is the slice directories on disk, as a running VM leaves them; no VM is booted.
func TestCacheBudgetKeepsImagesOfLiveSlices(t *testing.T) {
	data := t.TempDir()
	src := t.TempDir()
	cache := &imagecache.Cache{Dir: filepath.Join(data, "slice-images"), BudgetBytes: 4096}
	h := &Host{cfg: HostConfig{DataDir: data, Images: cache}}
	cache.Pinned = h.ImagesInUse
	ctx := context.Background()
	srcA, a := imageArtifact(t, src, "a", 4096)
	srcB, b := imageArtifact(t, src, "b", 4096)
	srcC, c := imageArtifact(t, src, "c", 4096)

	if err := h.pinImage("alloc-live", a); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cache.Get(ctx, srcA, a); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(cache.Dir, a+".img"), old, old); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct{ src, digest string }{{srcB, b}, {srcC, c}} {
		if _, _, err := cache.Get(ctx, s.src, s.digest); err != nil {
			t.Fatal(err)
		}
	}
	held := map[string]bool{}
	ents, err := cache.Entries()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		held[e.DigestSHA256] = true
		if e.DigestSHA256 == a && !e.Pinned {
			t.Fatalf("entry of the live slice's image is not marked pinned: %+v", e)
		}
	}
	if !held[a] || held[b] || !held[c] {
		t.Fatalf("cache holds %v; want the live slice's image a and the newest c", held)
	}

	// Released (the slice directory goes): a is the least recently used and goes next.
	if err := os.RemoveAll(h.SliceDir("alloc-live")); err != nil {
		t.Fatal(err)
	}
	if removed, err := cache.Evict(c); err != nil || len(removed) != 1 || removed[0].DigestSHA256 != a {
		t.Fatalf("after release: evicted %v, %v; want a", removed, err)
	}

	// A slice directory that does not say which image it holds stops eviction altogether.
	if err := os.MkdirAll(h.SliceDir("alloc-unknown"), 0o711); err != nil {
		t.Fatal(err)
	}
	cache.BudgetBytes = 1
	if _, err := cache.Evict(""); err == nil {
		t.Fatal("eviction went ahead with a slice whose image is unknown")
	}
	if ents, _ := cache.Entries(); len(ents) != 1 {
		t.Fatalf("entries after refused eviction: %v", ents)
	}
}
