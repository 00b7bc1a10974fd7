// Package imagecache downloads slice OS images into the host cache
// (/var/lib/gpuaas/slice-images), verifies their sha256 against the catalog digest, and
// hands out verified paths. A cached file is re-verified before use; a partial or
// mismatching download never becomes a cache entry. VMs never boot from the cache: the
// runtime converts the image onto the slot disk.
package imagecache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
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
	if _, err := os.Stat(p); err == nil {
		got, err := fileDigest(p)
		if err != nil {
			return "", false, err
		}
		if got == digest {
			return p, false, nil
		}
		_ = os.Remove(p) // corrupted cache entry: fetch again
	}
	if err := c.download(ctx, source, digest, p, progress); err != nil {
		return "", false, err
	}
	return p, true, nil
}

func (c *Cache) download(ctx context.Context, source, digest, dst string, progress func(done, total int64)) error {
	u, err := url.Parse(source)
	if err != nil {
		return fmt.Errorf("imagecache: source %q: %w", source, err)
	}
	var body io.ReadCloser
	total := int64(-1)
	switch u.Scheme {
	case "http", "https":
		hc := c.Client
		if hc == nil {
			hc = &http.Client{Timeout: 6 * time.Hour}
		}
		req, err := http.NewRequestWithContext(ctx, "GET", source, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("imagecache: download: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return fmt.Errorf("imagecache: download %s: %s", source, resp.Status)
		}
		body, total = resp.Body, resp.ContentLength
	case "file":
		f, err := os.Open(u.Path)
		if err != nil {
			return fmt.Errorf("imagecache: %w", err)
		}
		if fi, err := f.Stat(); err == nil {
			total = fi.Size()
		}
		body = f
	default:
		return fmt.Errorf("imagecache: unsupported source scheme %q (http, https, file)", u.Scheme)
	}
	defer body.Close()
	max := c.MaxBytes
	if max <= 0 {
		max = DefaultMaxBytes
	}
	if total > max {
		return fmt.Errorf("imagecache: image is %d bytes, over the %d byte cap", total, max)
	}
	tmp, err := os.CreateTemp(c.Dir, ".partial-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	h := sha256.New()
	var done int64
	buf := make([]byte, 1<<20)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			done += int64(n)
			if done > max {
				tmp.Close()
				return fmt.Errorf("imagecache: image exceeds the %d byte cap", max)
			}
			if _, err := tmp.Write(buf[:n]); err != nil {
				tmp.Close()
				return err
			}
			h.Write(buf[:n])
			if progress != nil {
				progress(done, total)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			tmp.Close()
			return fmt.Errorf("imagecache: download interrupted: %w", rerr)
		}
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("%w: catalog says %s, downloaded %s", ErrDigestMismatch, digest, got)
	}
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
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
