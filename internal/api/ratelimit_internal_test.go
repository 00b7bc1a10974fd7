package api

import (
	"testing"
	"time"
)

// The limiter refuses once the burst is spent and refills with the injected clock.
func TestIPLimiterBucketRefills(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newIPLimiter(RateLimit{Burst: 3, Every: 2 * time.Second}, func() time.Time { return now })
	for i := range 3 {
		if ok, _ := l.take("10.0.0.1"); !ok {
			t.Fatalf("attempt %d refused within the burst", i)
		}
	}
	ok, retry := l.take("10.0.0.1")
	if ok || retry != 2*time.Second {
		t.Fatalf("past the burst: ok=%v retry=%v, want refused for 2s", ok, retry)
	}
	if ok, _ := l.take("10.0.0.2"); !ok {
		t.Fatal("another address was throttled")
	}
	now = now.Add(time.Second)
	if ok, retry := l.take("10.0.0.1"); ok || retry != time.Second {
		t.Fatalf("half refilled: ok=%v retry=%v", ok, retry)
	}
	now = now.Add(time.Second)
	if ok, _ := l.take("10.0.0.1"); !ok {
		t.Fatal("not refilled after Every")
	}
	if ok, _ := newIPLimiter(RateLimit{Burst: -1}, time.Now).take("x"); !ok {
		t.Fatal("a disabled limiter refused")
	}
}
