package imagecache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// resumeServer serves img; its first answer sends only the first cut bytes (with the full
// Content-Length) and drops the connection. Later requests honour "Range: bytes=N-".
type resumeServer struct {
	img    []byte
	cut    int
	mu     sync.Mutex
	ranges []string // the Range header of each request ("" for none)
	served int      // body bytes written
}

func (s *resumeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	first := len(s.ranges) == 0
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	s.mu.Unlock()
	if first {
		w.Header().Set("Content-Length", strconv.Itoa(len(s.img)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(s.img[:s.cut])
		s.add(s.cut)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops mid-body
	}
	from := 0
	if rg := r.Header.Get("Range"); rg != "" {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"))
		if err != nil || n >= len(s.img) {
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		from = n
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, len(s.img)-1, len(s.img)))
		w.Header().Set("Content-Length", strconv.Itoa(len(s.img)-n))
		w.WriteHeader(http.StatusPartialContent)
	}
	_, _ = w.Write(s.img[from:])
	s.add(len(s.img) - from)
}

func (s *resumeServer) add(n int) {
	s.mu.Lock()
	s.served += n
	s.mu.Unlock()
}

// A connection dropped mid-body is retried and resumed with a Range request (the bytes
// already on disk are not fetched again), and the result is verified against the digest.
func TestDownloadResumesAfterDroppedConnection(t *testing.T) {
	img := []byte(strings.Repeat("0123456789abcdef", 1<<16)) // 1 MiB
	s := &resumeServer{img: img, cut: 300 << 10}
	srv := httptest.NewServer(s)
	defer srv.Close()
	dir := filepath.Join(t.TempDir(), "c")
	c := &Cache{Dir: dir, Backoff: time.Millisecond}
	p, fresh, err := c.Get(context.Background(), srv.URL+"/img", digestOf(img))
	if err != nil || !fresh {
		t.Fatalf("download after a dropped connection: fresh=%v err=%v", fresh, err)
	}
	if got, _ := fileDigest(p); got != digestOf(img) {
		t.Fatalf("cached image digest %s", got)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ranges) != 2 || s.ranges[0] != "" || s.ranges[1] != fmt.Sprintf("bytes=%d-", s.cut) {
		t.Fatalf("requests' Range headers %q: want none, then bytes=%d-", s.ranges, s.cut)
	}
	if s.served != len(img) {
		t.Fatalf("served %d bytes for a %d byte image: the resumed part was fetched again", s.served, len(img))
	}
}

// A resumed download whose bytes are corrupt is refused by the digest, leaves no cache entry
// and no partial file; a server that keeps failing is given up on after Attempts requests.
func TestDownloadCorruptOrFailingIsRefused(t *testing.T) {
	img := []byte(strings.Repeat("0123456789abcdef", 1<<16))
	bad := append([]byte(nil), img...)
	bad[len(bad)-10] ^= 0xff // the resumed part carries a flipped byte
	s := &resumeServer{img: bad, cut: 300 << 10}
	srv := httptest.NewServer(s)
	defer srv.Close()
	dir := filepath.Join(t.TempDir(), "c")
	c := &Cache{Dir: dir, Backoff: time.Millisecond}
	if _, _, err := c.Get(context.Background(), srv.URL+"/img", digestOf(img)); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("corrupt resumed image: want %v, got %v", ErrDigestMismatch, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a refused download left %d files in the cache", len(entries))
	}
	var hits atomic.Int32
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer failing.Close()
	c.Attempts = 3
	if _, _, err := c.Get(context.Background(), failing.URL, digestOf(img)); err == nil || !strings.Contains(err.Error(), "failed 3 times") || hits.Load() != 3 {
		t.Fatalf("always-failing server: %d requests, err %v", hits.Load(), err)
	}
	missing := httptest.NewServer(http.NotFoundHandler())
	defer missing.Close()
	hits.Store(0)
	if _, _, err := c.Get(context.Background(), missing.URL, digestOf(img)); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("failed downloads left %d files in the cache", len(entries))
	}
}
