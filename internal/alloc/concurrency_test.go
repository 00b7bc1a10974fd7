package alloc_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// TestConcurrentCreates: 200 concurrent creates of mixed sizes over 4 nodes x 8 slots. Every
// success holds exactly N slots on one node; no slot is in two live claims (checked in SQL);
// every failure is sku_unavailable.
func TestConcurrentCreates(t *testing.T) {
	b := setup(t)
	for i := 0; i < 4; i++ {
		b.addNode(fmt.Sprintf("n%d", i), i)
	}
	sizes := []int{1, 2, 1, 4, 1, 2, 8}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok []apiv1.Allocation
	var failures []error
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			a, err := b.create(b.tenant, "h200-sxm-slice", sizes[i%len(sizes)])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, err)
				return
			}
			ok = append(ok, a)
		}(i)
	}
	wg.Wait()
	gpus := 0
	for _, a := range ok {
		full, err := b.svc.Get(b.ctx, b.admin, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		nodes := map[string]bool{}
		for _, c := range full.Claims {
			nodes[c.NodeID] = true
		}
		if len(full.Claims) != a.GPUs || len(nodes) != 1 {
			t.Fatalf("allocation %s: %d GPUs, %d claims on %d nodes", a.ID, a.GPUs, len(full.Claims), len(nodes))
		}
		gpus += a.GPUs
	}
	for _, err := range failures {
		var ae *apiv1.Error
		if !errors.As(err, &ae) || ae.Code != apiv1.CodeSKUUnavailable {
			t.Fatalf("failure is not sku_unavailable: %v", err)
		}
	}
	if gpus > 32 || len(ok) == 0 {
		t.Fatalf("%d allocations hold %d GPUs of 32", len(ok), gpus)
	}
	t.Logf("%d succeeded holding %d GPUs, %d sku_unavailable", len(ok), gpus, len(failures))
	b.invariants()
}
