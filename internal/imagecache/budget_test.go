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

// artifact writes an image of n bytes (content tagged by name) and returns its file URL and
// digest.
func artifact(t *testing.T, name string, n int) (string, string) {
	t.Helper()
	b := []byte(strings.Repeat(name, n/len(name)+1)[:n])
	p := filepath.Join(t.TempDir(), name+".qcow2")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return "file://" + p, digestOf(b)
}

// age sets an entry's last use back by d, so LRU order does not depend on clock resolution.
func age(t *testing.T, c *Cache, digest string, d time.Duration) {
	t.Helper()
	when := time.Now().Add(-d)
	if err := os.Chtimes(c.path(digest), when, when); err != nil {
		t.Fatal(err)
	}
}

func cached(c *Cache) map[string]bool {
	ents, _ := c.Entries()
	out := map[string]bool{}
	for _, e := range ents {
		out[e.DigestSHA256] = true
	}
	return out
}

// Under a budget of two images, fetching a third evicts the least recently used one that no
// live slice uses: the oldest image is pinned (a running VM booted from it), so the next
// oldest goes, and the pinned one stays however old. A hit refreshes an image's place in
// the order. Evictions and hits are counted.
func TestBudgetEvictsLeastRecentlyUsedButNeverPinned(t *testing.T) {
	ctx := context.Background()
	c := &Cache{Dir: filepath.Join(t.TempDir(), "slice-images"), BudgetBytes: 2 * 1000}
	live := map[string]bool{}
	c.Pinned = func() (map[string]bool, error) { return live, nil }
	srcA, a := artifact(t, "a", 1000)
	srcB, b := artifact(t, "b", 1000)
	srcC, cc := artifact(t, "c", 1000)
	srcD, d := artifact(t, "d", 1000)
	for _, s := range []struct{ src, digest string }{{srcA, a}, {srcB, b}} {
		if _, fresh, err := c.Get(ctx, s.src, s.digest); err != nil || !fresh {
			t.Fatalf("get %s: fresh=%v %v", s.digest, fresh, err)
		}
	}
	age(t, c, a, 3*time.Hour) // a: oldest, and in use by a live VM
	age(t, c, b, 2*time.Hour)
	live[a] = true
	if _, _, err := c.Get(ctx, srcC, cc); err != nil {
		t.Fatal(err)
	}
	if got := cached(c); !got[a] || got[b] || !got[cc] {
		t.Fatalf("after c: cache holds %v; want a (pinned) and c, b evicted", got)
	}
	// A hit on c makes it the most recent; d then finds only c evictable and the cache stays
	// over budget rather than drop a.
	age(t, c, cc, time.Hour)
	if _, fresh, err := c.Get(ctx, srcC, cc); err != nil || fresh {
		t.Fatalf("hit on c: fresh=%v %v", fresh, err)
	}
	if _, _, err := c.Get(ctx, srcD, d); err != nil {
		t.Fatal(err)
	}
	if got := cached(c); !got[a] || got[cc] || !got[d] {
		t.Fatalf("after d: cache holds %v; want a (pinned) and d", got)
	}
	st := c.Stats()
	if st.Hits != 1 || st.Downloads != 4 || st.Evictions != 2 || st.EvictedBytes != 2000 {
		t.Fatalf("stats %+v", st)
	}
	// Once no VM uses a, it is the oldest and goes first when the budget shrinks.
	delete(live, a)
	c.BudgetBytes = 1000
	removed, err := c.Evict(d)
	if err != nil || len(removed) != 1 || removed[0].DigestSHA256 != a {
		t.Fatalf("evict after a's VM left: %v %v", removed, err)
	}
}

// When the cache cannot learn which images are in use it removes nothing.
func TestEvictRemovesNothingWhenPinsUnknown(t *testing.T) {
	ctx := context.Background()
	c := &Cache{Dir: filepath.Join(t.TempDir(), "slice-images"), BudgetBytes: 1}
	srcA, a := artifact(t, "a", 100)
	srcB, b := artifact(t, "b", 100)
	c.Pinned = func() (map[string]bool, error) { return nil, errors.New("slices dir unreadable") }
	for _, s := range []struct{ src, digest string }{{srcA, a}, {srcB, b}} {
		if _, _, err := c.Get(ctx, s.src, s.digest); err != nil {
			t.Fatal(err)
		}
	}
	if got := cached(c); !got[a] || !got[b] {
		t.Fatalf("cache holds %v; want both (pins unknown)", got)
	}
	if _, err := c.Evict(""); !errors.Is(err, ErrPinsUnknown) {
		t.Fatalf("evict = %v, want ErrPinsUnknown", err)
	}
	// Partial downloads are not entries and are never listed.
	if err := os.WriteFile(filepath.Join(c.Dir, ".partial-1"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ents, _ := c.Entries(); len(ents) != 2 {
		t.Fatalf("entries %v", ents)
	}
}
