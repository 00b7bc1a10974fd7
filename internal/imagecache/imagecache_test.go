package imagecache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

func digestOf(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestDownloadVerifyAndReuse(t *testing.T) {
	img := []byte(strings.Repeat("qcow2-ish image bytes ", 100000))
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = w.Write(img)
	}))
	defer srv.Close()
	var progressed int64
	c := &Cache{Dir: filepath.Join(t.TempDir(), "slice-images"), Progress: func(done, _ int64) { progressed = done }}
	ctx := context.Background()
	p, fresh, err := c.Get(ctx, srv.URL+"/img.qcow2", digestOf(img))
	if err != nil || !fresh || progressed != int64(len(img)) {
		t.Fatalf("get = %s %v %v (progress %d)", p, fresh, err, progressed)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("cache entry mode %v", fi.Mode().Perm())
	}
	if _, fresh, err := c.Get(ctx, srv.URL+"/img.qcow2", digestOf(img)); err != nil || fresh || hits.Load() != 1 {
		t.Fatalf("second get downloaded again (fresh=%v hits=%d err=%v)", fresh, hits.Load(), err)
	}
	// A corrupted cache entry is detected and fetched again.
	if err := os.WriteFile(p, []byte("bit rot"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, fresh, err := c.Get(ctx, srv.URL+"/img.qcow2", digestOf(img)); err != nil || !fresh || hits.Load() != 2 {
		t.Fatalf("corrupted entry not refetched: fresh=%v hits=%d err=%v", fresh, hits.Load(), err)
	}
}

func TestMismatchCapAndBadInput(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("x", 4096)))
	}))
	defer srv.Close()
	dir := filepath.Join(t.TempDir(), "c")
	c := &Cache{Dir: dir}
	ctx := context.Background()
	if _, _, err := c.Get(ctx, srv.URL, strings.Repeat("0", 64)); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("a failed download left %d files in the cache", len(entries))
	}
	small := &Cache{Dir: dir, MaxBytes: 1024}
	if _, _, err := small.Get(ctx, srv.URL, digestOf([]byte(strings.Repeat("x", 4096)))); err == nil || !strings.Contains(err.Error(), "cap") {
		t.Fatalf("cap: %v", err)
	}
	for _, bad := range [][2]string{{srv.URL, "nothex"}, {"ftp://x/y", strings.Repeat("a", 64)}} {
		if _, _, err := c.Get(ctx, bad[0], bad[1]); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
	// file:// sources (a local artifact store) work the same way.
	src := filepath.Join(t.TempDir(), "local.img")
	_ = os.WriteFile(src, []byte("local image"), 0o644)
	if _, fresh, err := c.Get(ctx, "file://"+src, digestOf([]byte("local image"))); err != nil || !fresh {
		t.Fatalf("file source: %v", err)
	}
}
