package leases

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func dir(t *testing.T) (*Dir, *clock) {
	c := &clock{t: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	return &Dir{Path: filepath.Join(t.TempDir(), "leases"), TTL: time.Hour, Now: c.now}, c
}

func TestAcquireIsExclusiveByDeviceAndReclaimsExpired(t *testing.T) {
	d, c := dir(t)
	ls, err := d.Acquire(Request{AllocationID: "a1", TaskID: "t1", Slots: map[string][]string{"s0": {"0000:1b:00.0", "0000:1a:00.2", "/dev/disk/by-id/x"}}})
	if err != nil || len(ls) != 1 {
		t.Fatal(ls, err)
	}
	fi, _ := os.Stat(filepath.Join(d.Path, "s0.json"))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("lease mode %v", fi.Mode().Perm())
	}
	// Another allocation: same slot, or another slot naming one of the same devices.
	if _, err := d.Acquire(Request{AllocationID: "a2", TaskID: "t2", Slots: map[string][]string{"s0": {"x"}}}); !errors.Is(err, ErrHeld) {
		t.Fatalf("same slot: %v", err)
	}
	if _, err := d.Acquire(Request{AllocationID: "a2", TaskID: "t2", Slots: map[string][]string{"s9": {"0000:1a:00.2"}}}); !errors.Is(err, ErrHeld) {
		t.Fatalf("same VF: %v", err)
	}
	// The same allocation retrying its task renews.
	if _, err := d.Acquire(Request{AllocationID: "a1", TaskID: "t1-retry", Slots: map[string][]string{"s0": {"0000:1b:00.0"}}}); err != nil {
		t.Fatalf("renew: %v", err)
	}
	// Another allocation cannot release it; after expiry it is reclaimed.
	if n, _ := d.Release("a2", []string{"s0"}); n != 0 {
		t.Fatal("another allocation released the lease")
	}
	c.t = c.t.Add(2 * time.Hour)
	if _, err := d.Acquire(Request{AllocationID: "a2", TaskID: "t3", Slots: map[string][]string{"s0": {"x"}}}); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	held, _ := d.Held()
	if len(held) != 1 || held[0].AllocationID != "a2" {
		t.Fatalf("held = %+v", held)
	}
	if n, _ := d.Release("a2", []string{"s0"}); n != 1 {
		t.Fatal("release failed")
	}
}

func TestAllOrNothing(t *testing.T) {
	d, _ := dir(t)
	if _, err := d.Acquire(Request{AllocationID: "a1", TaskID: "t", Slots: map[string][]string{"s1": {"dev1"}}}); err != nil {
		t.Fatal(err)
	}
	_, err := d.Acquire(Request{AllocationID: "a2", TaskID: "t", Slots: map[string][]string{"s2": {"dev2"}, "s3": {"dev1"}}})
	if !errors.Is(err, ErrHeld) {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.Path, "s2.json")); !os.IsNotExist(err) {
		t.Fatal("a partial lease was left behind")
	}
}

func TestConcurrentTasksNeverShareADevice(t *testing.T) {
	d, _ := dir(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, err := d.Acquire(Request{AllocationID: "a" + string(rune('a'+i)), TaskID: "t", Slots: map[string][]string{"s" + string(rune('a'+i)): {"shared-gpu"}}})
			if err == nil {
				mu.Lock()
				won++
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if won != 1 {
		t.Fatalf("%d tasks leased the same device", won)
	}
}

func TestTTLClamp(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	for v, want := range map[string]time.Duration{"": DefaultTTL, "10": MinTTL, "3600": time.Hour, "99999999": MaxTTL, "x": DefaultTTL} {
		if got := TTLFromEnv(env(v)); got != want {
			t.Fatalf("TTL(%q) = %s, want %s", v, got, want)
		}
	}
}
