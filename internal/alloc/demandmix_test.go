package alloc_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/demand"
	"github.com/gpuaas/gpuaas/internal/store"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// learning installs a demand learner on b's service, on b's clock.
func (b *testBundle) learning() *demand.Learner {
	l := demand.New(b.st, demand.Config{Now: b.clock.Now})
	b.svc.SetDemand(l)
	return l
}

func (b *testBundle) explainFirst(gpus int) apiv1.PlacementExplain {
	b.t.Helper()
	ex, err := b.svc.Explain(b.ctx, b.admin, apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: gpus})
	if err != nil || !ex.Feasible || len(ex.Choices) == 0 {
		b.t.Fatalf("explain %d GPUs: %+v, %v", gpus, ex, err)
	}
	return ex
}

// TestRefusedRequestsTeachTheMixThatSteersPlacement: requests refused for want of capacity
// are demand too. Whole hosts asked for and refused make the learned mix all 8-GPU, and the
// ranking then puts a single GPU where it breaks no whole-host hope more than it already is
// (the default mix sends it elsewhere, to spare a free NUMA group for 4-GPU requests that the
// learned demand never makes). Requests for a count the SKU does not sell are not demand.
func TestRefusedRequestsTeachTheMixThatSteersPlacement(t *testing.T) {
	b := setup(t)
	l := b.learning()
	// a: group 0 has one slot left (3), group 1 is whole; b: a hole in each group.
	a, bn := b.addNode("a", 1), b.addNode("b", 2)
	b.disable(a, 0, 1, 2)
	b.disable(bn, 0, 4)
	b.refreshCapacity()
	must(t, l.Refresh(b.ctx))
	ex := b.explainFirst(1)
	if ex.DemandMix == nil || ex.DemandMix.Source != demand.SourceDefault || ex.Choices[0].NodeName != "b" {
		t.Fatalf("before any history: mix %+v, first choice %s; want the default mix and node b", ex.DemandMix, ex.Choices[0].NodeName)
	}
	for i := range int(demand.MinRequests) {
		_, err := b.create(b.tenant, "h200-sxm-slice", 8)
		var ae *apiv1.Error
		if !errors.As(err, &ae) || ae.Code != apiv1.CodeSKUUnavailable {
			t.Fatalf("8 GPUs, request %d: %v, want a refusal (no node is whole)", i, err)
		}
		if _, err := b.create(b.tenant, "h200-sxm-slice", 3); err == nil {
			t.Fatal("3 GPUs were placed")
		}
	}
	must(t, l.Flush(b.ctx))
	must(t, l.Refresh(b.ctx))
	ex = b.explainFirst(1)
	want := []apiv1.DemandMixEntry{{GPUs: 8, Weight: 10000, Share: 1}}
	if m := ex.DemandMix; m.Source != demand.SourceLearned || m.Requests != demand.MinRequests || !reflect.DeepEqual(m.Entries, want) {
		t.Fatalf("after %v refused 8-GPU requests: mix %+v, want learned %v", demand.MinRequests, m, want)
	}
	if got := fmt.Sprint(ex.Choices[0].NodeName, ex.Choices[0].SlotIndexes); got != "a[3]" {
		t.Fatalf("with the learned mix the first choice is %s, want a[3] (%s)", got, ex.Choices[0].Reason)
	}
	// A create places where the explain said.
	got := b.mustCreate(1)
	if node, idx := b.placed(got); node != "a" || !reflect.DeepEqual(idx, []int{3}) {
		t.Fatalf("created on %s %v, want a [3]", node, idx)
	}
}

// TestPinnedMixIsAuditedAndWins: an admin's pin replaces what was learned, at once on this
// replica; tenants cannot pin; the pin is in the audit log; unpinning brings the learned mix
// back; capacity shows admins the mix and its source, and tenants nothing of it.
func TestPinnedMixIsAuditedAndWins(t *testing.T) {
	b := setup(t)
	l := b.learning()
	for range 100 {
		l.Record("h200-sxm-slice", "", 1)
	}
	must(t, l.Flush(b.ctx))
	must(t, l.Refresh(b.ctx))
	pin := []apiv1.DemandMixEntry{{GPUs: 1, Weight: 1}, {GPUs: 8, Weight: 1}}
	if _, err := b.svc.PinDemandMix(b.ctx, b.tenant, "h200-sxm-slice", pin); err == nil {
		t.Fatal("a tenant pinned a demand mix")
	}
	if _, err := b.svc.PinDemandMix(b.ctx, b.admin, "h200-sxm-slice", []apiv1.DemandMixEntry{{GPUs: 3, Weight: 1}}); err == nil {
		t.Fatal("pinned 3 GPUs, a count the SKU does not sell")
	}
	m, err := b.svc.PinDemandMix(b.ctx, b.admin, "h200-sxm-slice", pin)
	if err != nil || m.Source != demand.SourcePinned || m.PinnedBy != "admin" || len(m.Entries) != 2 || m.Entries[1].Share != 0.5 {
		t.Fatalf("pin: %+v, %v", m, err)
	}
	caps, err := b.svc.Capacity(b.ctx, b.admin, "h200-sxm-slice", "")
	if err != nil || len(caps) != 1 || caps[0].DemandMix == nil || caps[0].DemandMix.Source != demand.SourcePinned {
		t.Fatalf("admin capacity: %+v, %v; want the pinned mix", caps, err)
	}
	caps, err = b.svc.Capacity(b.ctx, b.tenant, "h200-sxm-slice", "")
	if err != nil || len(caps) != 1 || caps[0].DemandMix != nil {
		t.Fatalf("tenant capacity: %+v, %v; want no demand mix (every tenant's demand)", caps, err)
	}
	entries, err := b.st.ListAudit(b.ctx, store.AuditFilter{Action: "sku.demand_mix.pin"})
	if err != nil || len(entries) != 1 || entries[0].TargetID != "h200-sxm-slice" {
		t.Fatalf("audit: %+v, %v; want one sku.demand_mix.pin", entries, err)
	}
	if m, err := b.svc.PinDemandMix(b.ctx, b.admin, "h200-sxm-slice", nil); err != nil || m.Source != demand.SourceLearned {
		t.Fatalf("unpin: %+v, %v; want the learned mix back", m, err)
	}
}
