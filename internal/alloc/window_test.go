package alloc_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/sched"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/jackc/pgx/v5"
)

// With a fresh capacity hint, placement reads best-fit windows of nodes; the result is the
// same best-fit choice the full ranking makes, including past the first window, and a stale
// hint (saying a node has slots it has not) costs a window, never a wrong placement.
func TestWindowedPlacementMatchesBestFit(t *testing.T) {
	b := setup(t)
	var nodes []apiv1.Node
	for i := range 20 {
		nodes = append(nodes, b.addNode(fmt.Sprintf("w%02d", i), 60+i))
	}
	// w19 has 2 free slots in NUMA group 1, w18 has 3 free in group 1; the rest are empty.
	b.disable(nodes[19], 0, 1, 2, 3, 4, 5)
	b.disable(nodes[18], 0, 1, 2, 3, 4)
	b.refreshCapacity()
	if node, idx := b.placed(b.mustCreate(2)); node != "w19" || fmt.Sprint(idx) != "[6 7]" {
		t.Fatalf("2 GPUs went to %s %v, want the exact fit w19 [6 7]", node, idx)
	}
	// The hint still says w19 has 2 free; it has none. The next 2-GPU request must skip it.
	if node, _ := b.placed(b.mustCreate(2)); node != "w18" {
		t.Fatalf("2 GPUs went to %s, want w18 (3 free, the best fit left)", node)
	}
	// 4 GPUs (one NUMA group): w18 has 1 free now and w19 none, so a clean node, by name.
	if node, idx := b.placed(b.mustCreate(4)); node != "w00" || fmt.Sprint(idx) != "[0 1 2 3]" {
		t.Fatalf("4 GPUs went to %s %v, want w00 [0 1 2 3]", node, idx)
	}
	// Fill every clean node's groups through the windows, then the fleet is out of 8-GPU hosts.
	for i := 0; i < 17; i++ {
		b.mustCreate(8)
	}
	if _, err := b.create(b.tenant, "h200-sxm-slice", 8); err == nil {
		t.Fatal("an 8-GPU allocation was placed with no whole host left")
	}
	b.invariants()
}

// A request whose chosen slots are locked by a concurrent reservation takes equivalent free
// slots of the same NUMA group instead of failing or moving to a worse placement.
func TestLostSlotsAreSubstitutedWithinTheGroup(t *testing.T) {
	b := setup(t)
	n := b.addNode("subst", 90, withSlots(0, 1, 2, 3))
	slots := b.slots(n.ID)
	release := b.lockElsewhere(slots[0].ID, slots[1].ID) // a concurrent scheduler holds slots 0 and 1
	a, err := b.create(b.tenant, "h200-sxm-slice", 2)
	release()
	if err != nil {
		t.Fatalf("2 GPUs with 2 of 4 group slots locked: %v", err)
	}
	if node, idx := b.placed(a); node != "subst" || fmt.Sprint(idx) != "[2 3]" {
		t.Fatalf("placed on %s %v, want subst [2 3]", node, idx)
	}
	b.invariants()
}

// A lock that finds too few of its slots free (a concurrent reservation holds one) loses the
// race but reports the slots it did lock: they stay locked until its transaction ends, and
// the caller holds them in inFlight so this replica's other requests do not rank them as free.
func TestLostRaceReportsWhatItLocked(t *testing.T) {
	b := setup(t)
	n := b.addNode("lost", 91, withSlots(0, 1, 2, 3))
	slots := b.slots(n.ID)
	ids := make([]string, len(slots))
	for i, s := range slots {
		ids[i] = s.ID
	}
	release := b.lockElsewhere(slots[0].ID) // a concurrent scheduler holds slot 0
	var locked []string
	var lost bool
	b.tx(func(tx *store.Tx) error {
		var err error
		locked, lost, err = alloc.LockChoiceForTest(b.ctx, tx, n.ID, ids, ids)
		return err
	})
	release()
	if !lost || len(locked) != 3 || slices.Contains(locked, slots[0].ID) {
		t.Fatalf("lock of 4 slots with slot 0 held: lost %v, locked %v; want lost with the other 3 locked", lost, locked)
	}
}

// Create answers from what its transaction wrote; that answer is exactly what a read returns.
func TestCreateAnswerMatchesARead(t *testing.T) {
	b := setup(t)
	b.addNode("answer", 95)
	for _, actor := range []alloc.Actor{b.tenant, b.admin} {
		req := apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2}
		if actor.Role == "admin" {
			req.TenantID = b.tenant.TenantID
		}
		created, _, err := b.svc.Create(b.ctx, actor, req, "")
		if err != nil {
			t.Fatal(err)
		}
		read, err := b.svc.Get(b.ctx, actor, created.ID)
		if err != nil {
			t.Fatal(err)
		}
		cj, _ := json.Marshal(created)
		rj, _ := json.Marshal(read)
		if string(cj) != string(rj) {
			t.Fatalf("%s: create answered\n%s\nbut a read gives\n%s", actor.Role, cj, rj)
		}
	}
}

// A best-fit window that offers only spans does not hide a node with one NUMA group free: the
// 8 tightest nodes each have one free slot per group, the ninth has 3 free in group 1, and a
// 2-GPU request (NUMA-preferred) goes to the ninth, inside group 1.
func TestWindowOfSpansReadsOnForOneGroup(t *testing.T) {
	b := setup(t)
	for i := range 8 {
		b.disable(b.addNode(fmt.Sprintf("s%02d", i), 60+i), 0, 1, 2, 4, 5, 6) // free: 3 and 7
	}
	b.disable(b.addNode("t00", 70), 0, 1, 2, 3, 4) // free: 5, 6, 7
	b.refreshCapacity()
	node, idx, windows, scans := placeCounting(b, 2)
	if node != "t00" || fmt.Sprint(idx) != "[5 6]" {
		t.Fatalf("2 GPUs went to %s %v, want t00 [5 6] (one NUMA group) over a span in the first window", node, idx)
	}
	if windows != 1 || scans != 0 {
		t.Fatalf("placement read %d windows and %d fleet scans; want 1 window (t00 is the only node with a group of 2) and none", windows, scans)
	}
	b.refreshCapacity()
	// With no single group of 2 left anywhere (t00 has 1 free), a span is the right answer,
	// found by the whole fleet's ranking.
	node, idx, _, scans = placeCounting(b, 2)
	if node != "s00" || fmt.Sprint(idx) != "[3 7]" {
		t.Fatalf("2 GPUs went to %s %v, want the span s00 [3 7]", node, idx)
	}
	if scans != 1 {
		t.Fatalf("a span comes from the whole fleet's ranking; fleet scans went up by %d", scans)
	}
	b.invariants()
}

// Windows read only nodes whose largest free NUMA group could hold the request: more than
// WindowsBeforeFullScan windows of nodes with 2 + 2 free slots sort before the one node with
// a free group of 4, and a 4-GPU request (NUMA-required) still reads one window and no more,
// instead of 4 windows of nodes it cannot use and then every slot of the fleet.
func TestWindowSkipsNodesWithNoFittingGroup(t *testing.T) {
	b := setup(t)
	for i := range sched.WindowNodes*sched.WindowsBeforeFullScan + 1 {
		b.disable(b.addNode(fmt.Sprintf("f%02d", i), 100+i), 0, 1, 4, 5) // free: 2, 3 and 6, 7
	}
	b.disable(b.addNode("g00", 99), 0, 1, 2, 3) // free: group 1, whole
	b.refreshCapacity()
	node, idx, windows, scans := placeCounting(b, 4)
	if node != "g00" || fmt.Sprint(idx) != "[4 5 6 7]" {
		t.Fatalf("4 GPUs went to %s %v, want g00 [4 5 6 7]", node, idx)
	}
	if windows != 1 || scans != 0 {
		t.Fatalf("placement read %d windows and %d fleet scans; want 1 window and none", windows, scans)
	}
	// 2 GPUs fit in a group of every node: best fit and name order start at f00.
	if node, _ := b.placed(b.mustCreate(2)); node != "f00" {
		t.Fatalf("2 GPUs went to %s, want f00", node)
	}
	b.invariants()
}

// placeCounting creates a gpus-GPU allocation and returns where it was placed and how many
// windows and fleet scans placement read for it (alloc.Service.Stats).
func placeCounting(b *testBundle, gpus int) (node string, idx []int, windows, scans uint64) {
	before := b.svc.Stats()
	node, idx = b.placed(b.mustCreate(gpus))
	after := b.svc.Stats()
	return node, idx, after.Windows - before.Windows, after.FleetScans - before.FleetScans
}

// conflictingPlanner is a task planner that, planning the first allocation, commits a
// baremetal claim on its node from another transaction: what a concurrent baremetal
// reservation does between a slice create's slot lock and its insert.
type conflictingPlanner struct {
	b    *testBundle
	node string // the node the first plan was for
}

func (p *conflictingPlanner) ProvisionTask(plan store.DispatchInfo) (*store.NewTask, error) {
	if p.node == "" {
		p.node = plan.NodeID
		p.b.tx(func(tx *store.Tx) error {
			_, err := tx.InsertAllocation(p.b.ctx, store.NewAllocation{TenantID: p.b.other.TenantID, SKU: "h200-sxm-baremetal-8g",
				CapacityShape: "baremetal", GPUs: 8, NodeID: plan.NodeID},
				[]store.NewClaim{{Kind: "node_exclusive", NodeID: plan.NodeID}})
			return err
		})
	}
	return &store.NewTask{NodeID: plan.NodeID, AllocationID: plan.ID, Type: "slice.vm_provision", Payload: map[string]any{}, TTL: time.Hour}, nil
}

func (p *conflictingPlanner) TaskQueued(string) {}

// A create whose insert meets a claim committed after its window was read (the claims
// trigger refuses slot claims on a node a baremetal allocation now holds) places the request
// elsewhere, leaves nothing behind on the first node, and answers with what it wrote.
func TestCreateWhoseInsertConflictsPlacesElsewhere(t *testing.T) {
	b := setup(t)
	n1, n2 := b.addNode("n1", 1), b.addNode("n2", 2)
	b.refreshCapacity()
	p := &conflictingPlanner{b: b}
	b.svc.SetTaskPlanner(p)
	a := b.mustCreate(4)
	node, _ := b.placed(a)
	first := map[string]string{n1.ID: "n1", n2.ID: "n2"}[p.node]
	if first == "" || node == first {
		t.Fatalf("placed on %s; the conflicting claim was on %q", node, first)
	}
	if len(a.Claims) != 4 || len(a.Tasks) != 1 {
		t.Fatalf("answer: %d claims, %d tasks", len(a.Claims), len(a.Tasks))
	}
	for _, s := range b.slots(p.node) {
		if s.Status != "available" {
			t.Fatalf("%s slot %d is %s after the create that conflicted there", first, s.SlotIndex, s.Status)
		}
	}
	b.invariants()
}

// Among nodes equally tight for a request, the best-fit windows read the node holding more
// live allocations first (nodes.slice_allocations, kept by the capacity refresh), even past
// the first window in name order; and of nodes equal on both they read at most
// sched.WindowTies, however many the window spans (sched.WindowEmptyTies, fewer, is only for
// nodes holding no allocation).
func TestWindowsPreferNodesWithMoreAllocations(t *testing.T) {
	b := setup(t)
	many := b.addNode("z-many", 70)
	for range 7 {
		if node, _ := b.placed(b.mustCreate(1)); node != "z-many" {
			t.Fatalf("1 GPU went to %s with z-many the only node", node)
		}
	}
	// Ten nodes named before z-many, each with 1 free slot like it, held by one allocation
	// (4 GPUs) and three disabled slots: in slice mode too, one allocation against seven.
	for i := range 10 {
		n := b.addNode(fmt.Sprintf("a%02d", i), 71+i)
		b.refreshCapacity()
		if node, idx := b.placed(b.mustCreate(4)); node != n.Name || fmt.Sprint(idx) != "[0 1 2 3]" {
			t.Fatalf("4 GPUs went to %s %v, want %s [0 1 2 3]", node, idx, n.Name)
		}
		b.disable(n, 4, 5, 6)
	}
	b.refreshCapacity()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	hints := func() string {
		t.Helper()
		var out string
		err := conn.QueryRow(b.ctx, `SELECT string_agg(name || '=' || slice_allocations, ' ' ORDER BY name) FROM nodes
			WHERE name IN ('a00', 'a01', 'z-many')`).Scan(&out)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := hints(); got != "a00=1 a01=1 z-many=7" {
		t.Fatalf("allocation hints %s", got)
	}
	names := map[string]string{many.ID: many.Name}
	for i := range 10 {
		n, err := b.st.GetNode(b.ctx, fmt.Sprintf("a%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		names[n.ID] = n.Name
	}
	b.tx(func(tx *store.Tx) error {
		w, err := tx.SliceWindow(b.ctx, store.WindowRequest{Query: store.PlacementQuery{SKU: "h200-sxm-slice"}, GPUs: 1, Group: 1,
			Limit: sched.WindowNodes, Ties: sched.WindowTies, EmptyTies: sched.WindowEmptyTies})
		if err != nil {
			return err
		}
		var spans, read []string
		for _, id := range w.NodeIDs {
			spans = append(spans, names[id])
		}
		for _, id := range w.Read {
			read = append(read, names[id])
		}
		if got := strings.Join(spans, " "); got != "z-many a00 a01 a02 a03 a04 a05 a06 a07 a08 a09" {
			t.Errorf("the window spans %s, want z-many (seven allocations) before the ten with one", got)
		}
		if got := strings.Join(read, " "); got != "z-many a00 a01 a02 a03 a04 a05 a06 a07" {
			t.Errorf("the window reads %s, want z-many and the first %d of the ten alike", got, sched.WindowTies)
		}
		return nil
	})
	node, _ := b.placed(b.mustCreate(1))
	b.refreshCapacity()
	want := map[string]string{"a00": "a00=2 a01=1 z-many=7", "z-many": "a00=1 a01=1 z-many=8"}[node]
	if got := hints(); want == "" || got != want {
		t.Fatalf("1 GPU went to %s; allocation hints after it %s", node, got)
	}
	b.invariants()
}

// The ranking looks ahead: between two nodes equally tight, with the same free slot, the
// controller places where the allocations that share the node will leave holes that join (the
// look-ahead, sched/lookahead.go), reading each node's occupants from the database; before,
// the node with more live allocations came first.
func TestPlacementLooksAheadAtWhoSharesTheNode(t *testing.T) {
	b := setup(t)
	three := b.addNode("q-three", 90)
	b.refreshCapacity()
	for _, want := range []struct {
		gpus int
		idx  string
	}{{4, "[0 1 2 3]"}, {2, "[4 5]"}, {1, "[6]"}} {
		if node, idx := b.placed(b.mustCreate(want.gpus)); node != three.Name || fmt.Sprint(idx) != want.idx {
			t.Fatalf("%d GPUs went to %s %v, want q-three %s", want.gpus, node, idx, want.idx)
		}
	}
	b.disable(three, 7) // kept out of the way while p-five fills
	five := b.addNode("p-five", 91)
	b.refreshCapacity()
	for _, want := range []struct {
		gpus int
		idx  string
	}{{2, "[0 1]"}, {2, "[2 3]"}, {1, "[4]"}, {1, "[5]"}, {1, "[6]"}} {
		if node, idx := b.placed(b.mustCreate(want.gpus)); node != five.Name || fmt.Sprint(idx) != want.idx {
			t.Fatalf("%d GPUs went to %s %v, want p-five %s", want.gpus, node, idx, want.idx)
		}
	}
	b.tx(func(tx *store.Tx) error {
		_, err := tx.SetSlotEnabled(b.ctx, three.ID, 7, true, "test")
		return err
	})
	b.refreshCapacity()
	// Both nodes: slot 7 free, group 0 full, the same fragmentation change; p-five holds five
	// allocations (2+2 | 1+1+1), q-three three (4 | 2+1). The look-ahead scores q-three -0.55,
	// p-five -0.53 (sched.TestLookaheadMatchesItsDefinition holds the arithmetic).
	if node, idx := b.placed(b.mustCreate(1)); node != three.Name || fmt.Sprint(idx) != "[7]" {
		t.Fatalf("1 GPU went to %s %v, want q-three [7]", node, idx)
	}
	b.invariants()
}
