package agent

import (
	"fmt"
	"sync"
	"testing"

	"github.com/gpuaas/gpuaas/internal/task"
)

// Heartbeats and metrics list the spool while the sender removes acknowledged results: a
// result removed between the directory read and the file read is delivered, not an error,
// and never a crash (the soak found hostd panicking here).
func TestSpoolPendingWhileResultsAreRemoved(t *testing.T) {
	sp, err := NewSpool(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		const n = 100
		for i := 0; i < n; i++ {
			if err := sp.Put(task.Result{TaskID: fmt.Sprintf("t-%d-%d", round, i), Status: "succeeded"}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i++ {
				_ = sp.Remove(fmt.Sprintf("t-%d-%d", round, i))
			}
		}()
		for i := 0; i < 50; i++ {
			p, err := sp.Pending()
			if err != nil {
				t.Fatalf("Pending while results are removed: %v", err)
			}
			for _, r := range p {
				if r.TaskID == "" || r.Status != "succeeded" {
					t.Fatalf("Pending returned %+v", r)
				}
			}
		}
		wg.Wait()
		if p, err := sp.Pending(); err != nil || len(p) != 0 {
			t.Fatalf("after removing all: %d pending, %v", len(p), err)
		}
	}
}
