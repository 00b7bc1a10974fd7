package api

import (
	"sync"
	"time"
)

// How long a verified credential is trusted without asking the database: a token revoked
// in the database is refused by every controller replica within tokenCacheTTL, a node
// certificate within nodeCertCacheTTL (longer than a long poll's wait, so an idle host's
// renewed polls cost no query). It takes the lookup (and, for tokens, the last-use touch)
// off every request.
const (
	tokenCacheTTL    = 5 * time.Second
	nodeCertCacheTTL = 2 * maxPollWait
	authCacheMax     = 65536
)

// authCache maps a credential key (token hash, certificate serial) to what the database said
// about it, for its ttl.
type authCache[V any] struct {
	mu  sync.Mutex
	m   map[string]authEntry[V]
	ttl time.Duration
	now func() time.Time
	// gen counts drops: a lookup that began before a revocation must not cache what it read.
	gen uint64
}

type authEntry[V any] struct {
	v  V
	at time.Time
}

func newAuthCache[V any](ttl time.Duration) *authCache[V] {
	return &authCache[V]{m: map[string]authEntry[V]{}, ttl: ttl, now: time.Now}
}

// get returns the cached value, or on a miss the generation to hand to put.
func (c *authCache[V]) get(key string) (V, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || c.now().Sub(e.at) >= c.ttl {
		var zero V
		return zero, false, c.gen
	}
	return e.v, true, c.gen
}

// put caches v unless something was dropped since the lookup that read it began (gen).
func (c *authCache[V]) put(key string, v V, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.m) >= authCacheMax {
		now := c.now()
		for k, e := range c.m { // drop the expired; if none, drop everything (bounded memory)
			if now.Sub(e.at) >= c.ttl {
				delete(c.m, k)
			}
		}
		if len(c.m) >= authCacheMax {
			c.m = map[string]authEntry[V]{}
		}
	}
	c.m[key] = authEntry[V]{v: v, at: c.now()}
}

// drop forgets one key (a credential that changed).
func (c *authCache[V]) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.m, key)
}

// dropIf forgets every entry whose value matches (a revoked token id, a revoked node).
func (c *authCache[V]) dropIf(match func(V) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	n := 0
	for k, e := range c.m {
		if match(e.v) {
			delete(c.m, k)
			n++
		}
	}
	return n
}
