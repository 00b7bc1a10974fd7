package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/store"
)

// addNode registers an H200 node with its eight approved slots and a fresh heartbeat.
func addNode(t *testing.T, st *store.Store, name string, host int) apiv1.Node {
	t.Helper()
	ctx := context.Background()
	var n apiv1.Node
	err := st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		if n, err = tx.CreateNode(ctx, apiv1.NodeCreate{Name: name, Region: "lab", SKU: "h200-sxm-baremetal-8g", SliceSKU: "h200-sxm-slice"}); err != nil {
			return err
		}
		_, err = tx.ApplySlots(ctx, n.ID, fixtures.H200SlotMap(host), false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func window(t *testing.T, st *store.Store, gpus int, after *store.WindowKey, limit int) ([]string, *store.WindowKey) {
	t.Helper()
	var w store.Window
	err := st.InTx(context.Background(), func(tx *store.Tx) error {
		var err error
		w, err = tx.SliceWindow(context.Background(), store.WindowRequest{Query: store.PlacementQuery{SKU: "h200-sxm-slice"}, GPUs: gpus, After: after, Limit: limit})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return w.NodeIDs, &w.Next
}

// The best-fit hint follows slot changes only through a refresh, recounts only the nodes that
// changed, and orders windows by fewest available slots, then (no allocations here) name.
func TestCapacityHintAndWindows(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	var nodes []apiv1.Node
	for i := range 3 {
		nodes = append(nodes, addNode(t, st, fmt.Sprintf("cap-%d", i), 20+i))
	}
	if ids, _ := window(t, st, 1, nil, 10); len(ids) != 3 {
		t.Fatalf("an applied slot map sets its node's hint at once, so all 3 nodes are in the window before any refresh; got %v", ids)
	}
	if n, err := st.RefreshCapacity(ctx); err != nil || n != 0 {
		t.Fatalf("the hint is already exact, so the first refresh changes no node: %d, %v", n, err)
	}
	if n, err := st.RefreshCapacity(ctx); err != nil || n != 0 {
		t.Fatalf("nothing changed since: %d, %v", n, err)
	}
	// Disable two slots of cap-2 and one of cap-1: best fit is cap-2 (6), cap-1 (7), cap-0 (8).
	slots2, _ := st.ListSlots(ctx, nodes[2].ID)
	slots1, _ := st.ListSlots(ctx, nodes[1].ID)
	err := st.InTx(ctx, func(tx *store.Tx) error {
		for _, id := range []string{slots2[0].ID, slots2[1].ID, slots1[0].ID} {
			if err := tx.SetSlotStatus(ctx, id, "disabled", "test", nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := st.RefreshCapacity(ctx); err != nil || n != 2 {
		t.Fatalf("refresh recounts the two changed nodes: %d, %v", n, err)
	}
	ids, next := window(t, st, 1, nil, 2)
	if len(ids) != 2 || ids[0] != nodes[2].ID || ids[1] != nodes[1].ID {
		t.Fatalf("first window = %v, want [cap-2 cap-1]", ids)
	}
	if next.Available != 7 || next.Name != "cap-1" {
		t.Fatalf("window key = %+v", next)
	}
	ids, _ = window(t, st, 1, next, 2)
	if len(ids) != 1 || ids[0] != nodes[0].ID {
		t.Fatalf("second window = %v, want [cap-0]", ids)
	}
	// The pipelined form returns the same window with its candidates (full filter) and topology.
	err = st.InTx(ctx, func(tx *store.Tx) error {
		w, err := tx.SliceWindow(ctx, store.WindowRequest{Query: store.PlacementQuery{SKU: "h200-sxm-slice"}, GPUs: 1, Limit: 2})
		if err != nil {
			return err
		}
		if fmt.Sprint(w.NodeIDs) != fmt.Sprint([]string{nodes[2].ID, nodes[1].ID}) || w.Next != (store.WindowKey{Available: 7, Name: "cap-1"}) {
			return fmt.Errorf("window %v next %+v", w.NodeIDs, w.Next)
		}
		if len(w.Candidates) != 6+7 {
			return fmt.Errorf("%d candidates, want 13 (6 on cap-2, 7 on cap-1)", len(w.Candidates))
		}
		for _, c := range w.Candidates {
			if c.NodeID != nodes[2].ID && c.NodeID != nodes[1].ID {
				return fmt.Errorf("candidate %s on a node outside the window", c.SlotID)
			}
		}
		if tp := w.Topology[nodes[2].ID]; tp.ApprovedSlots != 6 || tp.GroupSize[0]+tp.GroupSize[1] != 6 || tp.ClaimedSlots != 0 {
			return fmt.Errorf("cap-2 topology %+v", tp)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := window(t, st, 7, nil, 10); len(ids) != 2 {
		t.Fatalf("7 GPUs fit by hint on cap-1 and cap-0 only, got %d nodes", len(ids))
	}
	// Draining nodes and silent agents are out of the window.
	if _, err := func() (apiv1.Node, error) {
		var n apiv1.Node
		err := st.InTx(ctx, func(tx *store.Tx) error {
			var err error
			n, err = tx.SetDraining(ctx, "cap-0", true)
			return err
		})
		return n, err
	}(); err != nil {
		t.Fatal(err)
	}
	if ids, _ := window(t, st, 8, nil, 10); len(ids) != 0 {
		t.Fatalf("the only 8-free node is draining; got %v", ids)
	}
	err = st.InTx(ctx, func(tx *store.Tx) error {
		w, err := tx.SliceWindow(ctx, store.WindowRequest{Query: store.PlacementQuery{SKU: "h200-sxm-slice", HeartbeatMaxAge: time.Minute}, GPUs: 1, Limit: 10})
		if err == nil && len(w.NodeIDs) != 0 {
			return fmt.Errorf("nodes never heard from are in the window: %v", w.NodeIDs)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Ids that are not UUIDs find nothing (and keep the queries on their indexes).
func TestMalformedIDsFindNothing(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	for _, id := range []string{"", "x", "1 OR 1=1", "00000000-0000-0000-0000-00000000000g"} {
		if _, err := st.GetAllocation(ctx, id, ""); err == nil {
			t.Errorf("GetAllocation(%q) found something", id)
		}
		if _, err := st.GetTask(ctx, id); err == nil {
			t.Errorf("GetTask(%q) found something", id)
		}
		if _, err := st.GetNode(ctx, id); err == nil {
			t.Errorf("GetNode(%q) found something", id)
		}
	}
}

// An operator's slot change (enable, disable) moves its node in the best-fit order at once,
// not at the next refresh.
func TestSlotEnabledMovesTheHintAtOnce(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	a, b := addNode(t, st, "en-a", 30), addNode(t, st, "en-b", 31)
	if ids, _ := window(t, st, 1, nil, 1); len(ids) != 1 || ids[0] != a.ID {
		t.Fatalf("both nodes have 8 free: en-a first by name; got %v", ids)
	}
	set := func(enabled bool) {
		t.Helper()
		err := st.InTx(ctx, func(tx *store.Tx) error {
			_, err := tx.SetSlotEnabled(ctx, b.ID, 3, enabled, "test")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	set(false)
	if ids, next := window(t, st, 1, nil, 1); len(ids) != 1 || ids[0] != b.ID || next.Available != 7 {
		t.Fatalf("en-b has 7 free after the disable: best fit first; got %v (key %+v)", ids, next)
	}
	set(true)
	if ids, _ := window(t, st, 1, nil, 1); len(ids) != 1 || ids[0] != a.ID {
		t.Fatalf("en-b re-enabled: back to name order; got %v", ids)
	}
}

// groupWindow reads a window with the NUMA-group hint (group available slots in one group) and
// returns its nodes and the nodes whose slots it read, checking that every candidate is on one
// of those.
func groupWindow(t *testing.T, st *store.Store, gpus, group int) (span, read []string) {
	t.Helper()
	var w store.Window
	err := st.InTx(context.Background(), func(tx *store.Tx) error {
		var err error
		w, err = tx.SliceWindow(context.Background(), store.WindowRequest{Query: store.PlacementQuery{SKU: "h200-sxm-slice"}, GPUs: gpus, Group: group, Limit: 10})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range w.Candidates {
		if !slices.Contains(w.Read, c.NodeID) {
			t.Fatalf("candidate %s on node %s, whose slots the window did not read (%v)", c.SlotID, c.NodeID, w.Read)
		}
	}
	return w.NodeIDs, w.Read
}

// A window starts at the first node whose largest free NUMA group could hold the request and
// reads the slots of only such nodes: a node with 2 + 2 free slots sorts first by available
// slots but cannot take a NUMA-local 4-GPU request. The hint (nodes.group_available) follows
// slot changes through the refresh, counts a slot of unknown NUMA node as a group of its own,
// and is exact at once after an operator's change.
func TestWindowReadsOnlyNodesWhoseGroupFits(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	split, half, whole := addNode(t, st, "grp-a", 40), addNode(t, st, "grp-b", 41), addNode(t, st, "grp-c", 42)
	take := func(node apiv1.Node, indexes ...int) {
		t.Helper()
		slots, err := st.ListSlots(ctx, node.ID)
		if err != nil {
			t.Fatal(err)
		}
		err = st.InTx(ctx, func(tx *store.Tx) error {
			for _, i := range indexes {
				if err := tx.SetSlotStatus(ctx, slots[i].ID, "reserved", "test", nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ids := func(nodes ...apiv1.Node) string {
		out := make([]string, len(nodes))
		for i, n := range nodes {
			out[i] = n.ID
		}
		return fmt.Sprint(out)
	}
	take(split, 0, 1, 4, 5) // 2 + 2 free
	take(half, 0, 1, 2, 3)  // 0 + 4 free
	if _, read := groupWindow(t, st, 4, 4); len(read) != 3 {
		t.Fatalf("before a refresh the hints are as the slot maps set them (every node 8 free, 4 per group); read %v", read)
	}
	if n, err := st.RefreshCapacity(ctx); err != nil || n != 2 {
		t.Fatalf("refresh recounts the two changed nodes: %d, %v", n, err)
	}
	if span, read := groupWindow(t, st, 4, 4); fmt.Sprint(span) != ids(half, whole) || fmt.Sprint(read) != ids(half, whole) {
		t.Fatalf("a 4-GPU window = %v (read %v), want it to start at grp-b: grp-a's 4 free slots are 2 + 2", span, read)
	}
	if span, read := groupWindow(t, st, 4, 0); fmt.Sprint(span) != ids(split, half, whole) || fmt.Sprint(read) != ids(split, half, whole) {
		t.Fatalf("with no group asked (a whole host), every node by best fit: %v (read %v)", span, read)
	}
	if span, read := groupWindow(t, st, 2, 2); fmt.Sprint(span) != ids(split, half, whole) || fmt.Sprint(read) != ids(split, half, whole) {
		t.Fatalf("a 2-GPU window = %v (read %v), want all three, grp-a first", span, read)
	}
	// Unknown NUMA: grp-c's slots lose their NUMA node; each free slot is a group of one.
	conn := connect(t, url)
	if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET numa_node = NULL WHERE node_id = $1`, whole.ID); err != nil {
		t.Fatal(err)
	}
	take(whole, 7)
	if n, err := st.RefreshCapacity(ctx); err != nil || n != 1 {
		t.Fatalf("refresh recounts grp-c: %d, %v", n, err)
	}
	var free, group int
	if err := conn.QueryRow(ctx, `SELECT available_slots, group_available FROM nodes WHERE id = $1`, whole.ID).Scan(&free, &group); err != nil || free != 7 || group != 1 {
		t.Fatalf("grp-c hints = %d free, largest group %d (%v); want 7 and 1", free, group, err)
	}
	if _, read := groupWindow(t, st, 1, 1); len(read) != 3 {
		t.Fatalf("a 1-GPU window reads a node of unknown NUMA: %v", read)
	}
	// grp-c is in the 2-GPU window's span (it follows grp-b in best-fit order), but has no known
	// group of 2: its slots are not read.
	if span, read := groupWindow(t, st, 2, 2); fmt.Sprint(span) != ids(split, half, whole) || fmt.Sprint(read) != ids(split, half) {
		t.Fatalf("a 2-GPU window = %v, read %v; want all three, grp-c not read", span, read)
	}
	// An operator's slot change recounts both hints at once.
	slots, _ := st.ListSlots(ctx, half.ID)
	err := st.InTx(ctx, func(tx *store.Tx) error {
		_, err := tx.SetSlotEnabled(ctx, half.ID, slots[4].SlotIndex, false, "test")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if span, _ := groupWindow(t, st, 4, 4); len(span) != 0 {
		t.Fatalf("no node has 4 free in one group once grp-b's slot is disabled, before any refresh: %v", span)
	}
}

// A window spans its positions but reads the slots of at most Ties of the nodes with the same
// best-fit key (available slots, live allocations; on an empty fleet, every node), in best-fit
// order, or EmptyTies of them when the key holds no allocation; Ties 0 reads them all.
// (alloc.TestWindowsPreferNodesWithMoreAllocations: EmptyTies leaves nodes holding
// allocations to Ties.)
func TestWindowReadsFewOfTheNodesAlike(t *testing.T) {
	st, _ := open(t)
	var names []string
	byID := map[string]string{}
	for i := range 12 {
		n := addNode(t, st, fmt.Sprintf("tie-%02d", i), 40+i)
		names, byID[n.ID] = append(names, n.Name), n.Name
	}
	read := func(ties, empty int, skip ...int) (spans, reads []string) {
		t.Helper()
		err := st.InTx(context.Background(), func(tx *store.Tx) error {
			w, err := tx.SliceWindow(context.Background(), store.WindowRequest{Query: store.PlacementQuery{SKU: "h200-sxm-slice"},
				GPUs: 1, Group: 1, Limit: 32, Ties: ties, EmptyTies: empty, EmptySkip: append(skip, 0)[0]})
			for _, id := range w.NodeIDs {
				spans = append(spans, byID[id])
			}
			for _, id := range w.Read {
				reads = append(reads, byID[id])
			}
			for _, c := range w.Candidates {
				if !slices.Contains(reads, c.NodeName) {
					t.Errorf("candidate slot on %s, a node the window did not read", c.NodeName)
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return spans, reads
	}
	spans, reads := read(8, 0)
	if !slices.Equal(spans, names) || !slices.Equal(reads, names[:8]) {
		t.Fatalf("Ties 8: the window spans %v and reads %v, want all 12 and the first 8", spans, reads)
	}
	if spans, reads = read(8, 2); !slices.Equal(spans, names) || !slices.Equal(reads, names[:2]) {
		t.Fatalf("Ties 8, EmptyTies 2: the window spans %v and reads %v, want all 12 and the first 2 (no node holds an allocation)", spans, reads)
	}
	if spans, reads = read(0, 0); !slices.Equal(spans, names) || !slices.Equal(reads, names) {
		t.Fatalf("Ties 0: the window spans %v and reads %v, want all 12 read", spans, reads)
	}
	if spans, reads = read(0, 3); !slices.Equal(spans, names) || !slices.Equal(reads, names[:3]) {
		t.Fatalf("Ties 0, EmptyTies 3: the window spans %v and reads %v, want all 12 and the first 3", spans, reads)
	}
	// A create's lane (alloc) passes over the empty nodes of the lanes before it, and reads
	// the last ones when too few follow: never none while the window holds some.
	if spans, reads = read(8, 2, 4); !slices.Equal(spans, names) || !slices.Equal(reads, names[4:6]) {
		t.Fatalf("EmptyTies 2, EmptySkip 4: the window spans %v and reads %v, want all 12 and the 5th and 6th", spans, reads)
	}
	if spans, reads = read(8, 2, 11); !slices.Equal(spans, names) || !slices.Equal(reads, names[10:]) {
		t.Fatalf("EmptyTies 2, EmptySkip 11: the window spans %v and reads %v, want all 12 and the last 2", spans, reads)
	}
	if spans, reads = read(8, 2, 30); !slices.Equal(spans, names) || !slices.Equal(reads, names[10:]) {
		t.Fatalf("EmptyTies 2, EmptySkip 30: the window spans %v and reads %v, want all 12 and the last 2", spans, reads)
	}
}

// EmptySkip passes over empty nodes only: nodes holding allocations are read by Ties as ever.
func TestWindowEmptySkipLeavesBusyNodesAlone(t *testing.T) {
	st, url := open(t)
	byID := map[string]string{}
	var names []string
	for i := range 6 {
		n := addNode(t, st, fmt.Sprintf("skip-%02d", i), 60+i)
		names, byID[n.ID] = append(names, n.Name), n.Name
	}
	// skip-00 and skip-01 hold an allocation (their hints say so): a key of their own.
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE nodes SET slice_allocations = 1 WHERE name = ANY($1)`, names[:2]); err != nil {
		t.Fatal(err)
	}
	var reads []string
	err = st.InTx(context.Background(), func(tx *store.Tx) error {
		w, err := tx.SliceWindow(context.Background(), store.WindowRequest{Query: store.PlacementQuery{SKU: "h200-sxm-slice"},
			GPUs: 1, Group: 1, Limit: 32, Ties: 8, EmptyTies: 2, EmptySkip: 2})
		for _, id := range w.Read {
			reads = append(reads, byID[id])
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{names[0], names[1], names[4], names[5]}; !slices.Equal(reads, want) {
		t.Fatalf("EmptySkip 2 with two busy nodes: read %v, want %v (both busy ones, then empty ones after the first two)", reads, want)
	}
}
