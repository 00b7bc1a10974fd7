// Package imagecache downloads slice OS images into the host cache
// (/var/lib/gpuaas/slice-images), verifies their sha256 against the catalog digest, and
// hands out verified paths. A cached file is re-verified before use; a partial or
// mismatching download never becomes a cache entry. An HTTP download that drops or meets a
// server error is retried with backoff and resumed where it stopped (Range); the digest is
// still checked over the whole file. VMs never boot from the cache: the
// runtime converts the image onto the slot disk.
//
// With a BudgetBytes the cache evicts least recently used images after each download until
// it fits, never one the Pinned hook names (images live slices use or provisions are
// writing); hits, downloads and evictions are counted (Stats).
package imagecache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultMaxBytes caps a single image (seed 000: 64 GiB).
const DefaultMaxBytes int64 = 64 << 30

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Cache is an image directory.
type Cache struct {
	Dir      string
	MaxBytes int64
	Client   *http.Client
	// Progress, when set, is called as bytes arrive (total -1 when unknown).
	Progress func(done, total int64)
	// Attempts bounds the requests of one HTTP download (DefaultAttempts when 0); Backoff is
	// the first wait between them, doubled each time up to 30 s (DefaultBackoff when 0).
	Attempts int
	Backoff  time.Duration
	// BudgetBytes bounds the cache's total size (0: unbounded); see Evict.
	BudgetBytes int64
	// Pinned names the digests that must stay cached (images of live slices, images being
	// written to a disk). Evict calls it under the cache lock; an error stops the eviction.
	Pinned func() (map[string]bool, error)

	mu     sync.Mutex // orders evictions against hits (touch); guards stamps
	n      counters
	stamps map[string]stamp // each cached image's stamp when it was last verified (verified.go)
}

// ErrDigestMismatch is an image whose content does not match the catalog digest.
var ErrDigestMismatch = errors.New("image digest mismatch")

func (c *Cache) path(digest string) string { return filepath.Join(c.Dir, digest+".img") }

// Get returns a verified local path for the image with digest, downloading it from source
// (http/https/file URL) when it is not cached. fresh reports whether it was downloaded now.
func (c *Cache) Get(ctx context.Context, source, digest string) (path string, fresh bool, err error) {
	return c.GetProgress(ctx, source, digest, c.Progress)
}

// GetProgress is Get reporting this download's progress to progress (nil: none); total is
// -1 when the source does not say.
func (c *Cache) GetProgress(ctx context.Context, source, digest string, progress func(done, total int64)) (path string, fresh bool, err error) {
	if !digestRE.MatchString(digest) {
		return "", false, fmt.Errorf("imagecache: digest %q is not a sha256 hex digest", digest)
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return "", false, err
	}
	p := c.path(digest)
	if cached, verified := c.touch(digest); cached {
		// Hashed again only when the file changed since it was last verified (verified.go);
		// a mismatching one is removed and fetched again.
		err := error(nil)
		if !verified {
			err = c.rehash(digest)
		}
		if err == nil {
			c.n.hits.Add(1)
			return p, false, nil
		}
		if !errors.Is(err, ErrDigestMismatch) {
			return "", false, err
		}
	}
	if err := c.download(ctx, source, digest, p, progress); err != nil {
		return "", false, err
	}
	c.n.downloads.Add(1)
	// Best effort: a failed eviction (pins unknown) leaves the cache over budget, never
	// short of an image in use.
	_, _ = c.Evict(digest)
	return p, true, nil
}

// Download retries (defaults of Cache.Attempts and Cache.Backoff).
const (
	DefaultAttempts = 5
	DefaultBackoff  = time.Second
	maxBackoff      = 30 * time.Second
)

// partial is a download in progress: the temporary file, the digest of what it holds, and
// how many bytes that is. A retry appends to it (HTTP Range) or starts it over.
type partial struct {
	f     *os.File
	h     hash.Hash
	done  int64
	total int64 // -1 when unknown
	max   int64
	prog  func(done, total int64)
}

// reset empties the partial file: the server sent the whole image again.
func (p *partial) reset() error {
	if err := p.f.Truncate(0); err != nil {
		return err
	}
	if _, err := p.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	p.h.Reset()
	p.done = 0
	return nil
}

// copyFrom appends body to the partial file, enforcing the size cap.
func (p *partial) copyFrom(body io.Reader) error {
	buf := make([]byte, 1<<20)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if p.done+int64(n) > p.max {
				return permanent(fmt.Errorf("imagecache: image exceeds the %d byte cap", p.max))
			}
			if _, err := p.f.Write(buf[:n]); err != nil {
				return permanent(err)
			}
			p.h.Write(buf[:n])
			p.done += int64(n)
			if p.prog != nil {
				p.prog(p.done, p.total)
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("imagecache: download interrupted after %d bytes: %w", p.done, rerr)
		}
	}
}

// permanentError is a download failure a retry cannot mend (not found, over the cap, a
// local disk error).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(err error) error { return &permanentError{err} }

func (c *Cache) download(ctx context.Context, source, digest, dst string, progress func(done, total int64)) error {
	u, err := url.Parse(source)
	if err != nil {
		return fmt.Errorf("imagecache: source %q: %w", source, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file" {
		return fmt.Errorf("imagecache: unsupported source scheme %q (http, https, file)", u.Scheme)
	}
	max := c.MaxBytes
	if max <= 0 {
		max = DefaultMaxBytes
	}
	tmp, err := os.CreateTemp(c.Dir, ".partial-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	p := &partial{f: tmp, h: sha256.New(), total: -1, max: max, prog: progress}
	if u.Scheme == "file" {
		err = p.copyFile(u.Path)
	} else {
		err = c.fetchHTTP(ctx, source, p)
	}
	if err != nil {
		tmp.Close()
		var pe *permanentError
		if errors.As(err, &pe) {
			return pe.err
		}
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// The digest covers every byte of the file, however many requests delivered them.
	if got := hex.EncodeToString(p.h.Sum(nil)); got != digest {
		return fmt.Errorf("%w: catalog says %s, downloaded %s", ErrDigestMismatch, digest, got)
	}
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	c.remember(digest) // its bytes were hashed as they arrived
	return nil
}

func (p *partial) copyFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("imagecache: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil {
		p.total = fi.Size()
	}
	if p.total > p.max {
		return fmt.Errorf("imagecache: image is %d bytes, over the %d byte cap", p.total, p.max)
	}
	return p.copyFrom(f)
}

// fetchHTTP downloads into p, retrying a dropped connection or a server error with
// exponential backoff (jittered) and resuming where the file ends with a Range request. A
// server that ignores the range sends the whole image, which starts the file over.
func (c *Cache) fetchHTTP(ctx context.Context, source string, p *partial) error {
	hc := c.Client
	if hc == nil {
		hc = &http.Client{Timeout: 6 * time.Hour}
	}
	attempts := c.Attempts
	if attempts <= 0 {
		attempts = DefaultAttempts
	}
	wait := c.Backoff
	if wait <= 0 {
		wait = DefaultBackoff
	}
	for attempt := 1; ; attempt++ {
		err := p.fetchOnce(ctx, hc, source)
		if err == nil {
			return nil
		}
		var pe *permanentError
		if errors.As(err, &pe) || ctx.Err() != nil {
			return err
		}
		if attempt >= attempts {
			return fmt.Errorf("imagecache: download %s failed %d times, giving up: %w", source, attempts, err)
		}
		d := wait/2 + rand.N(wait/2+1) // jitter in [wait/2, wait]
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, maxBackoff)
	}
}

func (p *partial) fetchOnce(ctx context.Context, hc *http.Client, source string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", source, nil)
	if err != nil {
		return permanent(err)
	}
	if p.done > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", p.done))
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("imagecache: download: %w", err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		if p.done > 0 {
			if err := p.reset(); err != nil {
				return permanent(err)
			}
		}
		p.total = resp.ContentLength
	case resp.StatusCode == http.StatusPartialContent && p.done > 0:
		start, total, ok := contentRange(resp.Header.Get("Content-Range"))
		if !ok || start != p.done {
			// Not the bytes asked for: start over rather than splice the wrong ones in.
			if err := p.reset(); err != nil {
				return permanent(err)
			}
			return fmt.Errorf("imagecache: server resumed at %q, not byte %d", resp.Header.Get("Content-Range"), p.done)
		}
		p.total = total
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		if err := p.reset(); err != nil {
			return permanent(err)
		}
		return fmt.Errorf("imagecache: download %s: %s (starting over)", source, resp.Status)
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		return fmt.Errorf("imagecache: download %s: %s", source, resp.Status)
	default:
		return permanent(fmt.Errorf("imagecache: download %s: %s", source, resp.Status))
	}
	if p.total > p.max {
		return permanent(fmt.Errorf("imagecache: image is %d bytes, over the %d byte cap", p.total, p.max))
	}
	return p.copyFrom(resp.Body)
}

// contentRange parses "bytes START-END/TOTAL" (TOTAL may be "*": -1).
func contentRange(v string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(v, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	s, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err := strconv.ParseInt(s, 10, 64)
	if err != nil || start < 0 {
		return 0, 0, false
	}
	total = -1
	if tot != "*" {
		if total, err = strconv.ParseInt(tot, 10, 64); err != nil {
			return 0, 0, false
		}
	}
	return start, total, true
}

func fileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
