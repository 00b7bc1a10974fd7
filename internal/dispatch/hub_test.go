package dispatch

import (
	"testing"
	"time"
)

// A renewed poll may skip the lease query only while nothing woke its node since a query
// found nothing, and never longer than the recheck bound.
func TestHubNothingNew(t *testing.T) {
	h := NewHub()
	t0 := time.Unix(1000, 0)
	if h.NothingNew("n1", t0, time.Minute) {
		t.Fatal("a node never queried must be queried")
	}
	g := h.Gen("n1")
	h.Empty("n1", g, t0)
	if !h.NothingNew("n1", t0.Add(time.Second), time.Minute) {
		t.Fatal("no wake since an empty query: the poll may skip")
	}
	if h.NothingNew("n1", t0.Add(time.Minute), time.Minute) {
		t.Fatal("past the recheck bound the poll must query")
	}
	h.Wake("n1")
	if h.NothingNew("n1", t0.Add(time.Second), time.Minute) {
		t.Fatal("after a wake the poll must query")
	}
	// A wake during the query (gen read before it) is not lost.
	g = h.Gen("n1")
	h.Wake("n1")
	h.Empty("n1", g, t0)
	if h.NothingNew("n1", t0.Add(time.Second), time.Minute) {
		t.Fatal("a wake that raced the empty query was lost")
	}
	if h.NothingNew("n2", t0, time.Minute) {
		t.Fatal("state leaked across nodes")
	}
}

// After lost notifications, WakeAll signals every waiting poll and voids every node's
// "nothing new" shortcut.
func TestHubWakeAll(t *testing.T) {
	h := NewHub()
	t0 := time.Unix(1000, 0)
	for _, n := range []string{"n1", "n2"} {
		h.Empty(n, h.Gen(n), t0)
	}
	ch1, cancel1 := h.Subscribe("n1")
	defer cancel1()
	ch3, cancel3 := h.Subscribe("n3")
	defer cancel3()
	h.WakeAll()
	for name, ch := range map[string]<-chan struct{}{"n1": ch1, "n3": ch3} {
		select {
		case <-ch:
		default:
			t.Fatalf("poll waiting for %s not woken", name)
		}
	}
	for _, n := range []string{"n1", "n2"} {
		if h.NothingNew(n, t0.Add(time.Second), time.Minute) {
			t.Fatalf("%s may still skip its lease query after WakeAll", n)
		}
	}
}
