package api

import (
	"testing"
	"time"
)

func TestAuthCacheExpiresAndStaysBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newAuthCache[string](5 * time.Second)
	c.now = func() time.Time { return now }
	c.put("a", "node-a")
	if v, ok := c.get("a"); !ok || v != "node-a" {
		t.Fatalf("fresh entry: %q %v", v, ok)
	}
	if _, ok := c.get("b"); ok {
		t.Fatal("unknown key found")
	}
	now = now.Add(5 * time.Second)
	if _, ok := c.get("a"); ok {
		t.Fatal("entry trusted past its ttl")
	}
	for i := range authCacheMax + 10 {
		c.put(string(rune(i)), "x")
	}
	if len(c.m) > authCacheMax {
		t.Fatalf("cache grew to %d entries (max %d)", len(c.m), authCacheMax)
	}
}
