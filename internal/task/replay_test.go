package task

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// records counts the completion records on disk (the watermark and temporary files start
// with a dot and are not records).
func records(t *testing.T, dir string) int {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range es {
		if e.Name()[0] != '.' {
			n++
		}
	}
	return n
}

// A completed task's record is kept until its not_after plus the clock skew (a replay until
// then is refused as a replay), then pruned; a pruned task delivered again with the host
// clock stepped back is still refused, never run.
func TestReplayStorePrunedAfterExpiryPlusSkew(t *testing.T) {
	pub, priv := keys(t)
	dir := filepath.Join(t.TempDir(), "completed")
	now := t0
	rs, err := NewDiskReplayStore(dir, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rs.Now = func() time.Time { return now }
	rs.PruneEvery = time.Minute
	var old []*Envelope
	for i := range 5 {
		e, err := New(priv, fmt.Sprintf("old-%d", i), "node-1", TypeReconcile, Reconcile{}, t0, time.Hour, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := rs.MarkCompleted(e.TaskID, e.NotAfter); err != nil {
			t.Fatal(err)
		}
		old = append(old, e)
	}
	mark := func(id string) {
		t.Helper()
		if err := rs.MarkCompleted(id, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	// Expired, but within the skew: a host whose clock is behind could still accept it.
	now = t0.Add(time.Hour + time.Minute)
	mark("later-1")
	if n := records(t, dir); n != 6 {
		t.Fatalf("%d records within the skew tolerance, want 6", n)
	}
	v := &Verifier{Key: pub, NodeID: "node-1", Now: func() time.Time { return t0.Add(30 * time.Minute) }, Replay: rs}
	if got := reason(t, func() error { _, err := v.Verify(old[0]); return err }()); got != RefuseReplay {
		t.Fatalf("replay within the window: reason %s", got)
	}
	// Past expiry plus skew: pruned.
	now = t0.Add(time.Hour + 2*time.Minute + time.Second)
	mark("later-2")
	if n, l := records(t, dir), rs.Len(); n != 2 || l != 2 {
		t.Fatalf("after expiry plus skew: %d records on disk, Len %d; want 2 (the expired 5 pruned)", n, l)
	}
	// A host clock stepped back to inside the old tasks' validity: their records are gone,
	// yet they are refused (replay window), not run, also by a restarted hostd.
	restarted, err := NewDiskReplayStore(dir, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, store := range []*DiskReplayStore{rs, restarted} {
		v.Replay = store
		for _, e := range old {
			if got := reason(t, func() error { _, err := v.Verify(e); return err }()); got != RefuseReplayWindow {
				t.Fatalf("pruned %s delivered again: reason %s, want %s", e.TaskID, got, RefuseReplayWindow)
			}
		}
		fresh, _ := New(priv, "fresh", "node-1", TypeReconcile, Reconcile{}, t0.Add(30*time.Minute), 2*time.Hour, 1)
		if _, err := v.Verify(fresh); err != nil {
			t.Fatalf("a new task expiring after the pruned ones refused: %v", err)
		}
	}
}

// The store never holds more than Max records; when full it evicts the records expiring
// soonest, and every evicted task stays refused (before and after a restart), while the
// records kept still answer "replay".
func TestReplayStoreBoundedNeverAcceptsAReplay(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "completed")
	rs, err := NewDiskReplayStore(dir, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rs.Now = func() time.Time { return t0 }
	rs.Max = 10
	expiry := func(i int) time.Time { return t0.Add(time.Hour + time.Duration(i)*time.Minute) }
	const total = 40
	for i := range total {
		if err := rs.MarkCompleted(fmt.Sprintf("t-%02d", i), expiry(i)); err != nil {
			t.Fatal(err)
		}
		if n := records(t, dir); n > rs.Max || rs.Len() != n {
			t.Fatalf("after %d completions: %d records on disk (Len %d), bound %d", i+1, n, rs.Len(), rs.Max)
		}
	}
	restarted, err := NewDiskReplayStore(dir, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, store := range []*DiskReplayStore{rs, restarted} {
		kept := 0
		for i := range total {
			done, err := store.Completed(fmt.Sprintf("t-%02d", i), expiry(i))
			switch {
			case done:
				kept++
			case errors.Is(err, ErrOutsideReplayWindow):
			default:
				t.Fatalf("completed task t-%02d would run again (done %v, err %v)", i, done, err)
			}
		}
		if kept == 0 || kept > rs.Max {
			t.Fatalf("%d records answer replay, want 1..%d", kept, rs.Max)
		}
		if done, _ := store.Completed(fmt.Sprintf("t-%02d", total-1), expiry(total-1)); !done {
			t.Fatal("the latest completion was evicted")
		}
	}
}
