package imagecache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A cached image is hashed once: neither a hit nor the verification before a disk write
// reads an unchanged file again, while a file whose stamp changed (touched, replaced under
// the same times, rewritten to another size) is hashed again, and refused and fetched anew
// when its bytes no longer match.
func TestCachedImageIsHashedOnceAndAgainOnlyWhenItChanges(t *testing.T) {
	dir := t.TempDir()
	img := []byte(strings.Repeat("raw image bytes ", 64<<10))
	src := filepath.Join(dir, "src.img")
	if err := os.WriteFile(src, img, 0o644); err != nil {
		t.Fatal(err)
	}
	digest := digestOf(img)
	c := &Cache{Dir: filepath.Join(dir, "cache")}
	ctx := context.Background()
	get := func(wantFresh bool) string {
		t.Helper()
		p, fresh, err := c.Get(ctx, "file://"+src, digest)
		if err != nil || fresh != wantFresh {
			t.Fatalf("get: fresh=%v %v, want fresh=%v", fresh, err, wantFresh)
		}
		return p
	}
	verify := func(wantHashed bool) {
		t.Helper()
		hashed, err := c.Verify(digest)
		if err != nil || hashed != wantHashed {
			t.Fatalf("verify: hashed=%v %v, want hashed=%v", hashed, err, wantHashed)
		}
	}
	wantHashes := func(n int64) {
		t.Helper()
		if got := c.Hashes(); got != n {
			t.Fatalf("cached files hashed: %d, want %d", got, n)
		}
	}

	// Downloaded (hashed as it arrived), then used three times: never read again.
	p := get(true)
	verify(false)
	for range 3 {
		get(false)
		verify(false)
	}
	wantHashes(0)

	// Touched (only its times change): hashed once more, then trusted again.
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	verify(true)
	verify(false)
	get(false)
	wantHashes(1)

	// Replaced by other bytes of the same size under the same times (a new inode): hashed,
	// refused, removed; the next use downloads it again.
	bad := []byte(strings.Repeat("RAW IMAGE BYTES ", 64<<10))
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p+".new", bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p+".new", fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(digest); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("verify of a replaced file: %v, want a digest mismatch", err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("the mismatching file is still cached: %v", err)
	}
	wantHashes(2)
	get(true)
	verify(false)

	// Rewritten in place to another size: a hit hashes it, finds the mismatch and fetches
	// the image again.
	if err := os.WriteFile(p, bad[:len(bad)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	get(true)
	wantHashes(3)
	verify(false)
	if st := c.Stats(); st.Downloads != 3 || st.Hits != 4 {
		t.Fatalf("stats %+v, want 3 downloads and 4 hits", st)
	}
}
