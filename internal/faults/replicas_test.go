package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

const image = "bench-slice-image" // seeded by benchenv

func oneGPU() apiv1.AllocationCreate {
	return apiv1.AllocationCreate{SKU: benchenv.SliceSKU, GPUs: 1, Image: image}
}

// A host long-polling replica A gets a task created through replica B at once: B's outbox
// worker commits the task and NOTIFYs; A's LISTEN wakes the parked poll. The host polls
// with a 60 s wait, and a renewed poll that found nothing skips the database for up to a
// minute, so without the cross-replica wake-up the task would wait most of a minute.
func TestCrossReplicaWakeup(t *testing.T) {
	c := newCluster(t, 2)
	c.addHost([]string{c.A.Server}, "--poll-wait", "60s")
	viaA, viaB := c.tenant(c.A.Server), c.tenant(c.B.Server)
	for i := 0; i < 3; i++ {
		a, err := viaB.CreateAllocation(c.ctx, oneGPU(), "")
		if err != nil {
			t.Fatal(err)
		}
		created := time.Now()
		// Taken by the host = provisioning (the controller marks it when it signs the task).
		st := allocStatus(t, viaA, a.ID, 60*time.Second, "provisioning", "active")
		// Generous against the 1 s dispatch target (a loaded 2-core CI box), far below the
		// minute the host would otherwise wait.
		if d := time.Since(created); d > 10*time.Second {
			t.Fatalf("allocation %d: created on B, reached the host polling A after %s (%s)", i, d, st)
		}
		allocStatus(t, viaA, a.ID, 60*time.Second, "active")
		// The tenant sees the same allocation through either replica.
		fromA, errA := viaA.GetAllocation(c.ctx, a.ID)
		fromB, errB := viaB.GetAllocation(c.ctx, a.ID)
		if errA != nil || errB != nil || fromA.Status != "active" || fromB.Status != fromA.Status || fromB.Node != fromA.Node {
			t.Fatalf("replicas disagree: A %+v (%v), B %+v (%v)", fromA, errA, fromB, errB)
		}
	}
}

// Both replicas take creates concurrently for more GPUs than exist: exactly the capacity is
// sold (nothing double-booked, nothing lost), every refusal is sku_unavailable, and the SQL
// invariants hold. The tenant then lists the same allocations through either replica.
func TestReplicasConcurrentCreatesNoDoubleBooking(t *testing.T) {
	c := newCluster(t, 2)
	const nodes, perWorker, workers = 4, 4, 12 // 32 GPUs; 12 workers x 4 x 2 GPUs = 96 asked
	if _, err := c.A.AddNodes(c.ctx, nodes); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var made []string
	var refused int
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker)
	for w := 0; w < workers; w++ {
		cl := c.tenant(c.A.Server)
		if w%2 == 1 {
			cl = c.tenant(c.B.Server)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				req := oneGPU()
				req.GPUs = 2
				a, err := cl.CreateAllocation(c.ctx, req, fmt.Sprintf("w%d-%d", w, i))
				var ae *apiv1.Error
				switch {
				case err == nil:
					mu.Lock()
					made = append(made, a.ID)
					mu.Unlock()
				case errors.As(err, &ae) && ae.Code == apiv1.CodeSKUUnavailable:
					mu.Lock()
					refused++
					mu.Unlock()
				default:
					errs <- fmt.Errorf("worker %d create %d: %w", w, i, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(made) != nodes*8/2 || refused != workers*perWorker-len(made) {
		t.Fatalf("sold %d two-GPU allocations (want exactly %d on %d GPUs), refused %d", len(made), nodes*8/2, nodes*8, refused)
	}
	c.checkInvariants()
	claims, err := c.A.Int(c.ctx, `SELECT count(DISTINCT slot_id) FROM allocation_resource_claims WHERE status IN ('reserved','provisioning','active')`)
	if err != nil || claims != nodes*8 {
		t.Fatalf("%d distinct slots claimed, want all %d (%v)", claims, nodes*8, err)
	}
	ids := func(cl interface {
		ListAllocations(context.Context, string) ([]apiv1.Allocation, error)
	}) []string {
		as, err := cl.ListAllocations(c.ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range as {
			out = append(out, a.ID+"/"+a.Status)
		}
		slices.Sort(out)
		return out
	}
	fromA, fromB := ids(c.tenant(c.A.Server)), ids(c.tenant(c.B.Server))
	if len(fromA) != len(made) || !slices.Equal(fromA, fromB) {
		t.Fatalf("tenant's list differs between replicas or from what was created:\nA %v\nB %v\ncreated %d", fromA, fromB, len(made))
	}
}
