package alloc_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/store"
)

// The soak's invariant checker must be able to fail: each state the lifecycle never
// produces, written behind the service's back, is reported, and a healthy lifecycle is not.
func TestInvariantsCatchInconsistentClaimsSlotsAndDeadlines(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a := b.mustCreate(2)
	b.invariants()
	within := func(d store.Deadlines) string {
		t.Helper()
		v, err := b.st.InvariantsWithin(b.ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(v, "\n")
	}
	// Still requested: within a century it is on time; with no time at all it is late.
	if v := within(store.Deadlines{Provision: 100 * 365 * 24 * time.Hour}); v != "" {
		t.Fatalf("violations within a generous deadline:\n%s", v)
	}
	if v := within(store.Deadlines{Provision: time.Nanosecond}); !strings.Contains(v, "neither active nor ended within the provisioning deadline: "+a.ID) {
		t.Fatalf("a requested allocation past its deadline is not reported:\n%s", v)
	}

	full, err := b.svc.Get(b.ctx, b.admin, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	// A slot moved without its claim (reserved -> provisioning is a legal slot transition).
	b.tx(func(tx *store.Tx) error {
		return tx.SetSlotStatus(b.ctx, full.Claims[0].SlotID, "provisioning", "", nil)
	})
	if v := within(store.Deadlines{}); !strings.Contains(v, "slot whose state disagrees with its live claim: "+full.Claims[0].SlotID+" slot provisioning, claim reserved") {
		t.Fatalf("slot/claim mismatch not reported:\n%s", v)
	}
	// Claims moved without their allocation.
	b.tx(func(tx *store.Tx) error { return tx.SetClaimsStatus(b.ctx, a.ID, "active", time.Now()) })
	if v := within(store.Deadlines{}); !strings.Contains(v, "live allocation with a live claim in another state: "+a.ID+" requested/active") {
		t.Fatalf("allocation/claim mismatch not reported:\n%s", v)
	}
}

func TestInvariantsHoldThroughReleaseDeadline(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	a := b.mustCreate(1)
	for _, step := range []func(string) error{func(id string) error { return b.svc.MarkProvisioning(b.ctx, id) },
		func(id string) error { return b.svc.MarkActive(b.ctx, id) }} {
		if err := step(a.ID); err != nil {
			t.Fatal(err)
		}
		b.invariants()
	}
	if _, err := b.svc.Release(b.ctx, b.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	b.invariants()
	// releasing_at comes from the service's (fake, past) clock: a release deadline of a
	// century holds, one of a nanosecond is missed.
	v, err := b.st.InvariantsWithin(b.ctx, store.Deadlines{Release: 100 * 365 * 24 * time.Hour})
	if err != nil || len(v) > 0 {
		t.Fatalf("violations within a generous release deadline: %v %v", v, err)
	}
	v, err = b.st.InvariantsWithin(b.ctx, store.Deadlines{Release: time.Nanosecond})
	if err != nil || len(v) != 1 || !strings.Contains(v[0], "still releasing past the release deadline: "+a.ID) {
		t.Fatalf("a release past its deadline: %v %v", v, err)
	}
}
