package alloc_test

import (
	"errors"
	"fmt"
	"strings"
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

// A NUMA group whose slots another create of this replica has locked (its transaction not yet
// committed, so they still read as available) is tried last: the create takes the other
// group instead of losing the lock race on the best one. Once that create ends, the group is
// the best choice again.
func TestCreateAvoidsGroupsLockedByConcurrentCreates(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	slots := b.slots(n.ID)
	var group0 []string
	for _, s := range slots {
		if s.SlotIndex < 4 {
			group0 = append(group0, s.ID)
		}
	}
	release := b.svc.HoldForTest(group0)
	_, idx := b.placed(b.mustCreate(4))
	eqIdx(t, idx, 4, 5, 6, 7)
	release()
	_, idx = b.placed(b.mustCreate(4))
	eqIdx(t, idx, 0, 1, 2, 3)
	// With every group held, the windows skip them, and the fleet-wide ranking, the last
	// resort, still tries them (a holder may yet fail): here nothing is really locked, so it
	// succeeds on the best choice. n1 is full by now.
	n2 := b.addNode("n2", 2)
	slots = b.slots(n2.ID)
	var all []string
	for _, s := range slots {
		all = append(all, s.ID)
	}
	defer b.svc.HoldForTest(all)()
	node, idx := b.placed(b.mustCreate(4))
	if node != "n2" {
		t.Fatalf("placed on %s, want n2", node)
	}
	eqIdx(t, idx, 0, 1, 2, 3)
}

// Concurrent creates on an empty fleet each find a node of their own in the windows: a window
// reads only two of the nodes alike that hold no allocation (sched.WindowEmptyTies), and each
// create in a transaction reads two of its own (its lane), so a burst does not lose its races
// window after window and end in whole-fleet rankings.
func TestConcurrentCreatesOnAnEmptyFleetStayInWindows(t *testing.T) {
	b := setup(t)
	for i := range 120 {
		b.addNode(fmt.Sprintf("e%03d", i), i)
	}
	b.refreshCapacity()
	const creates = 32
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, creates)
	for range creates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := b.create(b.tenant, "h200-sxm-slice", 4)
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("create: %v", err)
		}
	}
	if st := b.svc.Stats(); st.FleetScans != 0 {
		t.Fatalf("%d concurrent creates on 120 empty nodes ranked the whole fleet %d times (%d windows)", creates, st.FleetScans, st.Windows)
	}
	b.invariants()
}

// TestFullFleetUnderContentionNeverSaysRetry: 32 concurrent 1-GPU creates on 8 slots. Exactly
// 8 succeed and the fleet is full, so no refusal may tell its client to retry: a retry cannot
// succeed. (Requests that lost every race to concurrent ones used to say "retry".)
func TestFullFleetUnderContentionNeverSaysRetry(t *testing.T) {
	b := setup(t)
	b.addNode("n0", 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	var retry []string
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.create(b.tenant, "h200-sxm-slice", 1)
			mu.Lock()
			defer mu.Unlock()
			var ae *apiv1.Error
			switch {
			case err == nil:
				ok++
			case errors.As(err, &ae) && ae.Code == apiv1.CodeSKUUnavailable:
				if ae.Details["retryable"] == true || strings.Contains(ae.Message, "retry") {
					retry = append(retry, ae.Message)
				}
			default:
				t.Errorf("refusal is not sku_unavailable: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != 8 {
		t.Fatalf("%d of 8 slots taken", ok)
	}
	t.Logf("%d refusals said retry", len(retry))
	if len(retry) > 0 {
		t.Fatalf("%d refusals on a full fleet said retry, e.g. %q", len(retry), retry[0])
	}
	b.invariants()
}
