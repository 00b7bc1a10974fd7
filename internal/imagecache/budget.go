package imagecache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// Entry is one verified image in the cache: its digest, size and when a provision last used
// it (the file's modification time, set on every use: the LRU clock).
type Entry struct {
	DigestSHA256 string    `json:"digest_sha256"`
	SizeBytes    int64     `json:"size_bytes"`
	LastUsed     time.Time `json:"last_used"`
	// Pinned is an image a live slice uses or a provision is writing: never evicted.
	Pinned bool `json:"pinned,omitempty"`
}

// Stats counts what the cache did since the process started.
type Stats struct {
	Hits         int64 `json:"hits"`
	Downloads    int64 `json:"downloads"`
	Evictions    int64 `json:"evictions"`
	EvictedBytes int64 `json:"evicted_bytes"`
}

// counters are the cache's running totals (Stats reads them).
type counters struct {
	hits, downloads, evictions, evictedBytes atomic.Int64
	hashes                                   atomic.Int64 // re-verifications of cached files (Hashes)
}

// Stats returns the running totals.
func (c *Cache) Stats() Stats {
	return Stats{Hits: c.n.hits.Load(), Downloads: c.n.downloads.Load(),
		Evictions: c.n.evictions.Load(), EvictedBytes: c.n.evictedBytes.Load()}
}

// ErrPinsUnknown is an eviction that could not learn which images are in use: it removes
// nothing rather than guess.
var ErrPinsUnknown = errors.New("imagecache: images in use unknown; nothing evicted")

// Entries lists the cached images, least recently used first, each marked pinned when the
// Pinned hook names it (pinned is left false when the hook fails).
func (c *Cache) Entries() ([]Entry, error) {
	pins, _ := c.pins()
	return c.entries(pins)
}

func (c *Cache) pins() (map[string]bool, error) {
	if c.Pinned == nil {
		return map[string]bool{}, nil
	}
	return c.Pinned()
}

func (c *Cache) entries(pins map[string]bool) ([]Entry, error) {
	des, err := os.ReadDir(c.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, de := range des {
		digest, ok := strings.CutSuffix(de.Name(), ".img")
		if !ok || !digestRE.MatchString(digest) || !de.Type().IsRegular() {
			continue // partial downloads and anything else are not entries
		}
		fi, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, Entry{DigestSHA256: digest, SizeBytes: fi.Size(), LastUsed: fi.ModTime().UTC(), Pinned: pins[digest]})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].LastUsed.Equal(out[j].LastUsed) {
			return out[i].LastUsed.Before(out[j].LastUsed)
		}
		return out[i].DigestSHA256 < out[j].DigestSHA256
	})
	return out, nil
}

// touch records a use of the entry for digest (the LRU clock); false when it is not cached.
// It holds the eviction lock, so an entry found here is not removed by an eviction that
// started before the caller pinned it. verified says the file was unchanged since it was
// last verified: its stamp is then moved past this touch's own change of its times, so the
// touch does not make it look rewritten.
func (c *Cache) touch(digest string) (cached, verified bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.path(digest)
	if _, err := os.Stat(p); err != nil {
		delete(c.stamps, digest)
		return false, false
	}
	verified = c.unchanged(digest)
	now := time.Now()
	_ = os.Chtimes(p, now, now)
	if verified {
		c.remember(digest)
	} else {
		delete(c.stamps, digest)
	}
	return true, verified
}

// Evict removes least recently used images until the cache fits BudgetBytes (0: no
// budget, nothing removed). It never removes keep (the image a provision just fetched) nor
// an image the Pinned hook names, and when the hook fails it removes nothing
// (ErrPinsUnknown). It returns what it removed. The cache may stay over budget when what
// is left is all in use.
func (c *Cache) Evict(keep string) ([]Entry, error) {
	if c.BudgetBytes <= 0 {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	pins, err := c.pins()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPinsUnknown, err)
	}
	ents, err := c.entries(pins)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, e := range ents {
		total += e.SizeBytes
	}
	var removed []Entry
	for _, e := range ents {
		if total <= c.BudgetBytes {
			break
		}
		if e.Pinned || e.DigestSHA256 == keep {
			continue
		}
		if err := os.Remove(filepath.Join(c.Dir, e.DigestSHA256+".img")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, err
		}
		delete(c.stamps, e.DigestSHA256)
		total -= e.SizeBytes
		removed = append(removed, e)
		c.n.evictions.Add(1)
		c.n.evictedBytes.Add(e.SizeBytes)
	}
	return removed, nil
}
