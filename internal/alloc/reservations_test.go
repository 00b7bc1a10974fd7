package alloc_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

func (b *testBundle) reserve(actor alloc.Actor, gpus int) apiv1.Reservation {
	b.t.Helper()
	r, err := b.svc.CreateReservation(b.ctx, actor, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: gpus})
	if err != nil {
		b.t.Fatalf("reserve %d GPUs: %v", gpus, err)
	}
	return r
}

func (b *testBundle) createIn(actor alloc.Actor, reservation string, gpus int) (apiv1.Allocation, error) {
	out, _, err := b.svc.Create(b.ctx, actor, apiv1.AllocationCreate{GPUs: gpus, ReservationID: reservation}, "")
	return out, err
}

// sql runs one statement on the test database (what the service API does not do).
func (b *testBundle) sql(query string, args ...any) {
	b.t.Helper()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	if _, err := conn.Exec(b.ctx, query, args...); err != nil {
		b.t.Fatal(err)
	}
}

// hint is node's best-fit hint (nodes.available_slots).
func (b *testBundle) hint(node string) int {
	b.t.Helper()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	var n int
	if err := conn.QueryRow(b.ctx, `SELECT available_slots FROM nodes WHERE name = $1`, node).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

// heldSlots is the slot indexes of node a reservation holds.
func (b *testBundle) heldSlots(node, reservation string) []int {
	b.t.Helper()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	rows, _ := conn.Query(b.ctx, `SELECT s.slot_index FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
		WHERE n.name = $1 AND s.reservation_id = $2::uuid ORDER BY 1`, node, reservation)
	idx, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		b.t.Fatal(err)
	}
	return idx
}

// A reservation is placed as an allocation of its size would be (a whole NUMA group for 4
// GPUs), its slots serve only creates inside it, a release inside it returns them to it, and
// cancelling it returns them to the fleet.
func TestReservationHoldsSlotsForItsTenant(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	b.refreshCapacity()
	res := b.reserve(b.tenant, 4)
	held := b.heldSlots("n1", res.ID)
	if len(held) != 4 || res.Status != "active" || res.Free != 4 || res.GPUs != 4 || res.Price.GPUHourlyPriceMinor != 450 || res.PricePolicy == "" {
		t.Fatalf("reservation = %+v holding slots %v", res, held)
	}
	if !slices.Equal(held, []int{0, 1, 2, 3}) && !slices.Equal(held, []int{4, 5, 6, 7}) {
		t.Fatalf("4 GPUs held on slots %v; want one NUMA group", held)
	}
	b.refreshCapacity()
	if hint := b.hint("n1"); hint != 4 {
		t.Fatalf("best-fit hint %d with 4 of 8 slots held; want 4 (held slots are not the fleet's)", hint)
	}
	// The other tenant gets the other group, then nothing.
	o, err := b.create(b.other, "h200-sxm-slice", 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, idx := b.placed(o); slices.Equal(idx, held) {
		t.Fatalf("another tenant took the reserved slots %v", idx)
	}
	if reason, d := unavailableReason(t, func() error { _, err := b.create(b.other, "h200-sxm-slice", 1); return err }()); reason != apiv1.ReasonNoCapacity ||
		d["held_by_reservations"] != 4 {
		t.Fatalf("reason = %s, details %v; want no_capacity with 4 slots held by reservations", reason, d)
	}
	// Nor does the reserving tenant outside its reservation.
	if _, err := b.create(b.tenant, "h200-sxm-slice", 1); err == nil {
		t.Fatal("a create outside the reservation took a held slot")
	}
	a, err := b.createIn(b.tenant, res.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, idx := b.placed(a); len(idx) != 2 || !slices.Contains(held, idx[0]) || !slices.Contains(held, idx[1]) || a.ReservationID != res.ID {
		t.Fatalf("allocation inside the reservation on slots %v (held %v), reservation %q", idx, held, a.ReservationID)
	}
	// Another tenant cannot create inside it, nor see it.
	if _, err := b.createIn(b.other, res.ID, 1); !isCode(err, apiv1.CodeNotFound) {
		t.Fatalf("another tenant's create inside the reservation: %v", err)
	}
	if _, err := b.svc.GetReservation(b.ctx, b.other, res.ID); !isCode(err, apiv1.CodeNotFound) {
		t.Fatalf("another tenant reads the reservation: %v", err)
	}
	got, err := b.svc.GetReservation(b.ctx, b.tenant, res.ID)
	if err != nil || got.InUse != 2 || got.Free != 2 || got.Node == "" || got.Node == "n1" {
		t.Fatalf("tenant's view = %+v, %v", got, err)
	}
	// Explain inside the reservation: the tenant's answer in words, no host.
	ex, err := b.svc.Explain(b.ctx, b.tenant, apiv1.PlacementRequest{GPUs: 2, ReservationID: res.ID})
	if err != nil || !ex.Feasible || len(ex.Choices) != 0 {
		t.Fatalf("explain inside the reservation = %+v, %v", ex, err)
	}
	ex, err = b.svc.Explain(b.ctx, b.admin, apiv1.PlacementRequest{GPUs: 4, ReservationID: res.ID})
	if err != nil || ex.Feasible || ex.Reason != apiv1.ReasonReservationFull {
		t.Fatalf("admin's explain of 4 GPUs in a reservation with 2 free = %+v, %v", ex, err)
	}
	if _, err := b.svc.Explain(b.ctx, b.other, apiv1.PlacementRequest{GPUs: 1, ReservationID: res.ID}); !isCode(err, apiv1.CodeNotFound) {
		t.Fatalf("another tenant's explain inside the reservation: %v", err)
	}
	// More than it has free: says so.
	reason, d := unavailableReason(t, func() error { _, err := b.createIn(b.tenant, res.ID, 4); return err }())
	if reason != apiv1.ReasonReservationFull || d["free_slots"] != 2 {
		t.Fatalf("reason = %s, details %v", reason, d)
	}
	// Released before provisioning: the slots go straight back to the reservation.
	if _, err := b.svc.Release(b.ctx, b.tenant, a.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.heldSlots("n1", res.ID); !slices.Equal(got, held) {
		t.Fatalf("after the release the reservation holds %v; want %v", got, held)
	}
	b.refreshCapacity()
	if _, err := b.create(b.other, "h200-sxm-slice", 1); err == nil {
		t.Fatal("a released slot of the reservation went to the fleet")
	}
	if _, err := b.createIn(b.tenant, res.ID, 4); err != nil {
		t.Fatalf("the whole reservation after the release: %v", err)
	}
	c, err := b.svc.CancelReservation(b.ctx, b.tenant, res.ID)
	if err != nil || c.Status != "cancelled" || c.EndedAt == nil {
		t.Fatalf("cancel = %+v, %v", c, err)
	}
	if _, err := b.svc.CancelReservation(b.ctx, b.tenant, res.ID); !isCode(err, apiv1.CodeConflict) {
		t.Fatalf("second cancel: %v", err)
	}
	if got := b.heldSlots("n1", res.ID); len(got) != 0 {
		t.Fatalf("a cancelled reservation still holds %v", got)
	}
	b.refreshCapacity()
	if hint := b.hint("n1"); hint != 0 {
		t.Fatalf("best-fit hint %d once every slot is in use; want 0", hint)
	}
	if _, err := b.createIn(b.tenant, res.ID, 1); !isCode(err, apiv1.CodeConflict) {
		t.Fatalf("a create inside a cancelled reservation: %v", err)
	}
	b.invariants()
}

func isCode(err error, code string) bool {
	var ae *apiv1.Error
	if errors.As(err, &ae) && ae.Code == code {
		return true
	}
	var dbe *store.DBError
	return code == apiv1.CodeConflict && errors.As(err, &dbe) && errors.Is(err, store.ErrConflict)
}

// The database, not only placement, keeps a held slot for its reservation: a claim written
// directly on it for an allocation outside the reservation is refused, and so is a hold on a
// slot that is not available.
func TestDatabaseRefusesClaimOnHeldSlot(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	res := b.reserve(b.tenant, 1)
	held := b.heldSlots("n1", res.ID)
	var slotID string
	for _, s := range b.slots(n.ID) {
		if s.SlotIndex == held[0] {
			slotID = s.ID
		}
	}
	claim := func(actor alloc.Actor, reservation string) error {
		return b.st.InTx(b.ctx, func(tx *store.Tx) error {
			_, err := tx.InsertAllocation(b.ctx, store.NewAllocation{TenantID: actor.TenantID, SKU: "h200-sxm-slice",
				CapacityShape: "gpu_slice", GPUs: 1, Region: "lab", NodeID: n.ID, PriceSnapshot: map[string]any{}, ReservationID: reservation},
				[]store.NewClaim{{Kind: "slot", NodeID: n.ID, SlotID: slotID, Snapshot: json.RawMessage(`{}`)}})
			return err
		})
	}
	if err := claim(b.other, ""); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("another tenant's claim on a held slot: %v", err)
	}
	if err := claim(b.tenant, ""); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the tenant's claim outside its reservation on a held slot: %v", err)
	}
	if err := claim(b.other, res.ID); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("another tenant's allocation naming the reservation: %v", err)
	}
	if err := claim(b.tenant, res.ID); err != nil {
		t.Fatalf("the claim inside the reservation: %v", err)
	}
	// A second reservation cannot take the now reserved slot, nor one on another node.
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	var other string
	if err := conn.QueryRow(b.ctx, `INSERT INTO capacity_reservations (tenant_id, sku, region, node_id, gpus, price_snapshot)
		VALUES ($1, 'h200-sxm-slice', 'lab', $2, 1, '{}') RETURNING id::text`, b.other.TenantID, n.ID).Scan(&other); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(b.ctx, `UPDATE node_resource_slots SET reservation_id = $1 WHERE id = $2`, other, slotID); err == nil {
		t.Fatal("a reservation took a slot another holds and an allocation uses")
	}
	// A reservation keeps its size, and an ended one stays ended.
	if _, err := conn.Exec(b.ctx, `UPDATE capacity_reservations SET gpus = 8 WHERE id = $1`, res.ID); err == nil {
		t.Fatal("a reservation grew without placement")
	}
	if _, err := conn.Exec(b.ctx, `UPDATE capacity_reservations SET status = 'cancelled', ended_at = now() WHERE id = $1`, other); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(b.ctx, `UPDATE capacity_reservations SET status = 'active', ended_at = NULL WHERE id = $1`, other); err == nil {
		t.Fatal("an ended reservation became active again")
	}
	b.invariants()
}

// Creates inside and outside reservations, all at once, never book one slot twice: every
// allocation inside a reservation is on its held slots, no other is.
func TestConcurrentCreatesInsideAndOutsideReservations(t *testing.T) {
	b := setup(t)
	for i := range 4 {
		b.addNode(fmt.Sprintf("c%d", i), i)
	}
	b.refreshCapacity()
	r1, r2 := b.reserve(b.tenant, 4), b.reserve(b.tenant, 8)
	b.refreshCapacity()
	var wg sync.WaitGroup
	var mu sync.Mutex
	inside := map[string][]apiv1.Allocation{}
	var outside []apiv1.Allocation
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var a apiv1.Allocation
			var err error
			res := ""
			switch i % 3 {
			case 0:
				res = r1.ID
				a, err = b.createIn(b.tenant, res, 1)
			case 1:
				res = r2.ID
				a, err = b.createIn(b.tenant, res, 2)
			default:
				a, err = b.create(b.other, "h200-sxm-slice", 1)
			}
			mu.Lock()
			defer mu.Unlock()
			var ae *apiv1.Error
			switch {
			case err == nil && res != "":
				inside[res] = append(inside[res], a)
			case err == nil:
				outside = append(outside, a)
			case errors.As(err, &ae) && ae.Code == apiv1.CodeSKUUnavailable:
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	heldBy := map[string]string{} // node/slot -> reservation
	for _, r := range []apiv1.Reservation{r1, r2} {
		full, _ := b.svc.GetReservation(b.ctx, b.admin, r.ID)
		for _, i := range b.heldSlots(full.Node, r.ID) {
			heldBy[fmt.Sprintf("%s/%d", full.Node, i)] = r.ID
		}
	}
	gpus := map[string]int{}
	for res, as := range inside {
		for _, a := range as {
			node, idx := b.placed(a)
			for _, i := range idx {
				if heldBy[fmt.Sprintf("%s/%d", node, i)] != res {
					t.Fatalf("allocation in %s on %s slot %d, not its reservation's", res, node, i)
				}
			}
			gpus[res] += a.GPUs
		}
	}
	for _, a := range outside {
		node, idx := b.placed(a)
		for _, i := range idx {
			if r := heldBy[fmt.Sprintf("%s/%d", node, i)]; r != "" {
				t.Fatalf("another tenant's allocation on %s slot %d, held by %s", node, i, r)
			}
		}
	}
	if gpus[r1.ID] != 4 || gpus[r2.ID] != 8 || len(outside) != 32-12 {
		t.Fatalf("inside: %v GPUs; outside: %d allocations; want each reservation full and the 20 free GPUs taken", gpus, len(outside))
	}
	b.invariants()
}

// A reservation that cannot be met says why, as a refused create does.
func TestReservationThatCannotBeMetSaysWhy(t *testing.T) {
	b := setup(t)
	// Seven slots on each node: 14 free GPUs, never 8 on one host.
	b.addNode("n1", 1, withSlots(0, 1, 2, 3, 4, 5, 6))
	b.addNode("n2", 2, withSlots(0, 1, 2, 3, 4, 5, 6))
	b.refreshCapacity()
	_, err := b.svc.CreateReservation(b.ctx, b.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 8})
	reason, d := unavailableReason(t, err)
	if reason != apiv1.ReasonNoCapacity && reason != apiv1.ReasonTopologyFragmented {
		t.Fatalf("reason = %s", reason)
	}
	if d["requested_gpus"] != 8 || d["free_slots"] == nil {
		t.Fatalf("details = %v", d)
	}
	if _, err := b.svc.CreateReservation(b.ctx, b.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 3}); err == nil {
		t.Fatal("a reservation of a count the SKU does not allow")
	}
	if _, err := b.svc.CreateReservation(b.ctx, b.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-baremetal-8g", GPUs: 8}); !isCode(err, apiv1.CodeInvalidRequest) {
		t.Fatalf("a baremetal reservation: %v", err)
	}
	if _, err := b.svc.CreateReservation(b.ctx, b.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 1, DurationSeconds: -5}); !isCode(err, apiv1.CodeInvalidRequest) {
		t.Fatalf("a negative duration: %v", err)
	}
	if _, err := b.svc.CreateReservation(b.ctx, b.admin, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 1}); !isCode(err, apiv1.CodeInvalidRequest) {
		t.Fatalf("an admin's reservation for no tenant: %v", err)
	}
	if _, err := b.svc.CreateReservation(b.ctx, b.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 1, TenantID: b.other.TenantID}); !isCode(err, apiv1.CodeForbidden) {
		t.Fatalf("a tenant reserving for another: %v", err)
	}
	// An admin reserves for a tenant: the tenant's, shown to the admin with the node's name.
	r, err := b.svc.CreateReservation(b.ctx, b.admin, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 2, TenantID: b.tenant.TenantID})
	if err != nil || r.TenantID != b.tenant.TenantID || (r.Node != "n1" && r.Node != "n2") {
		t.Fatalf("admin's reservation for the tenant = %+v, %v", r, err)
	}
	if _, err := b.svc.GetReservation(b.ctx, b.tenant, r.ID); err != nil {
		t.Fatalf("the tenant reads the reservation an admin made for it: %v", err)
	}
}

// Quotas count held GPUs: a reservation and creates outside it share the GPU limit, while
// creates inside it take no more.
func TestQuotaCountsReservations(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	b.addNode("n2", 2)
	b.refreshCapacity()
	b.setQuota(b.tenant.TenantID, "", intp(8), nil)
	res := b.reserve(b.tenant, 4)
	b.refreshCapacity()
	if _, err := b.create(b.tenant, "h200-sxm-slice", 4); err != nil {
		t.Fatal(err)
	}
	d := quotaExceeded(t, func() error { _, err := b.create(b.tenant, "h200-sxm-slice", 1); return err }())
	if d["used"] != int64(8) {
		t.Fatalf("details = %v", d)
	}
	if _, err := b.createIn(b.tenant, res.ID, 4); err != nil {
		t.Fatalf("inside the reservation: %v", err)
	}
	_, err := b.svc.CreateReservation(b.ctx, b.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 1})
	quotaExceeded(t, err)
	if _, err := b.svc.CancelReservation(b.ctx, b.tenant, res.ID); err != nil {
		t.Fatal(err)
	}
	// Ended, its allocation counts as any other: 4 + 4 of 8.
	qs, _ := b.svc.Quotas(b.ctx, b.tenant, "")
	if len(qs) != 1 || qs[0].UsedGPUs != 8 || qs[0].UsedAllocs != 2 {
		t.Fatalf("quotas = %+v", qs)
	}
}

// Expiry under load: while creates run against the fleet, two controllers' expiry loops end
// every due reservation exactly once and its slots return to the fleet; reservations not due
// keep theirs.
func TestReservationExpiryUnderLoad(t *testing.T) {
	b := setup(t)
	for i := range 6 {
		b.addNode(fmt.Sprintf("e%d", i), i)
	}
	b.refreshCapacity()
	var due []apiv1.Reservation
	for range 4 {
		due = append(due, b.reserve(b.tenant, 4))
	}
	keep, err := b.svc.CreateReservation(b.ctx, b.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 8, DurationSeconds: 3600})
	if err != nil || keep.EndsAt == nil {
		t.Fatalf("reservation with a duration: %+v, %v", keep, err)
	}
	b.sql(`UPDATE capacity_reservations SET created_at = now() - interval '2 hours', ends_at = now() - interval '1 second'
		WHERE id <> $1`, keep.ID)
	b.refreshCapacity()
	var wg sync.WaitGroup
	var mu sync.Mutex
	expired := 0
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				n, err := b.svc.ExpireReservations(b.ctx)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				expired += n
				mu.Unlock()
			}
		}()
	}
	for range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.create(b.other, "h200-sxm-slice", 1); err != nil && !isCode(err, apiv1.CodeSKUUnavailable) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if expired != len(due) {
		t.Fatalf("%d reservations expired; want %d, once each", expired, len(due))
	}
	for _, r := range due {
		got, _ := b.svc.GetReservation(b.ctx, b.admin, r.ID)
		if got.Status != "expired" || len(b.heldSlots(got.Node, r.ID)) != 0 {
			t.Fatalf("due reservation = %+v", got)
		}
	}
	kept, _ := b.svc.GetReservation(b.ctx, b.admin, keep.ID)
	if kept.Status != "active" || len(b.heldSlots(kept.Node, keep.ID)) != 8 {
		t.Fatalf("reservation not due = %+v", kept)
	}
	// Every GPU but the kept reservation's is the fleet's again.
	b.refreshCapacity()
	n := 0
	for {
		if _, err := b.create(b.other, "h200-sxm-slice", 1); err != nil {
			break
		}
		n++
	}
	list, _ := b.svc.List(b.ctx, b.other, "")
	if len(list) != 48-8 {
		t.Fatalf("the other tenant holds %d allocations (%d after expiry); want every GPU but the kept reservation's 8", len(list), n)
	}
	b.invariants()
}

// A baremetal allocation takes a whole node, so never one with held slots: placement passes
// such a node by, and the database refuses its exclusive claim.
func TestBaremetalNeverTakesANodeWithHeldSlots(t *testing.T) {
	b := setup(t)
	n := b.addNode("n1", 1)
	b.reserve(b.tenant, 1)
	if reason, _ := unavailableReason(t, func() error { _, err := b.create(b.other, "h200-sxm-baremetal-8g", 8); return err }()); reason != apiv1.ReasonNoCapacity {
		t.Fatalf("reason = %s", reason)
	}
	err := b.st.InTx(b.ctx, func(tx *store.Tx) error {
		_, err := tx.InsertAllocation(b.ctx, store.NewAllocation{TenantID: b.other.TenantID, SKU: "h200-sxm-baremetal-8g",
			CapacityShape: "baremetal", GPUs: 8, Region: "lab", NodeID: n.ID, PriceSnapshot: map[string]any{}},
			[]store.NewClaim{{Kind: "node_exclusive", NodeID: n.ID, Snapshot: json.RawMessage(`{}`)}})
		return err
	})
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("an exclusive claim on a node with held slots: %v", err)
	}
}

// The invariant checker reports a held slot claimed from outside its reservation (written
// with the database's checks switched off, as a row from before them would be).
func TestInvariantsCatchAClaimOnAHeldSlot(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	res := b.reserve(b.tenant, 1)
	a := b.mustCreate(1)
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	if _, err := conn.Exec(b.ctx, `SET session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(b.ctx, `UPDATE node_resource_slots s SET reservation_id = $1 FROM allocation_resource_claims c
		WHERE c.slot_id = s.id AND c.allocation_id = $2`, res.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	v, err := b.st.Invariants(b.ctx)
	if err != nil || len(v) != 1 || !strings.Contains(v[0], "claimed by an allocation outside it") {
		t.Fatalf("invariants = %v, %v", v, err)
	}
}
