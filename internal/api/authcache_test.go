package api

import (
	"testing"
	"time"
)

func TestAuthCacheExpiresAndStaysBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newAuthCache[string](5 * time.Second)
	c.now = func() time.Time { return now }
	c.put("a", "node-a", 0)
	if v, ok, _ := c.get("a"); !ok || v != "node-a" {
		t.Fatalf("fresh entry: %q %v", v, ok)
	}
	if _, ok, _ := c.get("b"); ok {
		t.Fatal("unknown key found")
	}
	now = now.Add(5 * time.Second)
	if _, ok, _ := c.get("a"); ok {
		t.Fatal("entry trusted past its ttl")
	}
	for i := range authCacheMax + 10 {
		c.put(string(rune(i)), "x", 0)
	}
	if len(c.m) > authCacheMax {
		t.Fatalf("cache grew to %d entries (max %d)", len(c.m), authCacheMax)
	}
}

// A revocation drops matching entries, and a lookup that read the database before the
// revocation cannot put the stale answer back.
func TestAuthCacheDropBeatsInFlightLookup(t *testing.T) {
	c := newAuthCache[string](time.Minute)
	c.put("s1", "node-a", 0)
	c.put("s2", "node-a", 0)
	c.put("s3", "node-b", 0)
	_, _, gen := c.get("s4") // a lookup of s4 (node-a) starts...
	if n := c.dropIf(func(v string) bool { return v == "node-a" }); n != 2 {
		t.Fatalf("dropped %d entries, want 2", n)
	}
	c.put("s4", "node-a", gen) // ...and finishes after the revocation
	for _, k := range []string{"s1", "s2", "s4"} {
		if _, ok, _ := c.get(k); ok {
			t.Fatalf("%s still cached after its node was revoked", k)
		}
	}
	if v, ok, _ := c.get("s3"); !ok || v != "node-b" {
		t.Fatal("another node's entry was dropped")
	}
	_, _, gen = c.get("s1")
	c.put("s1", "node-c", gen)
	if _, ok, _ := c.get("s1"); !ok {
		t.Fatal("a lookup that began after the revocation was not cached")
	}
}
