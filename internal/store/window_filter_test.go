package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/gpuaas/gpuaas/internal/store"
)

// The window's statement states the slot filter per node (node checks once, VF checks over
// the node's slots and live claims already read); the fleet-wide statement states it per slot.
// On a fleet where every rule excludes something, the two must find the same candidates, and
// the window's topology must be NodeTopologies'.
func TestWindowAgreesWithFleetWideFilter(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	ids := map[string]string{}
	for i, name := range []string{"a-plain", "b-shared-vf", "c-claimed-vf", "d-exclusive", "e-baremetal",
		"f-slot-policies", "g-draining", "h-not-ready", "i-busy", "j-other-region"} {
		ids[name] = addNode(t, st, name, 80+i).ID
	}
	conn := refreshAndConnect(t, st, url)
	slot := func(node string, i int) string {
		return fmt.Sprintf("(SELECT id FROM node_resource_slots WHERE node_id = '%s' AND slot_index = %d)", ids[node], i)
	}
	meta := func(node string, i int, key, value string) string {
		return fmt.Sprintf(`UPDATE node_resource_slots SET capacity_metadata = jsonb_set(capacity_metadata, '{%s}', to_jsonb('%s'::text)) WHERE id = %s;`, key, value, slot(node, i))
	}
	vfOf := func(node string, i int) string {
		return fmt.Sprintf("(SELECT capacity_metadata->>'fabric_vf_pci_address' FROM node_resource_slots WHERE id = %s)", slot(node, i))
	}
	sql := `INSERT INTO tenants (name) VALUES ('filter');` +
		// b: slots 1 and 2 share a VF (both out); slot 3 is disabled and shares slot 4's VF (4 stays in).
		// The database refuses two enabled slots with one VF (migration 017); the filter still
		// keeps such slots out, for rows written before that, so the test writes them with the
		// session's triggers off.
		`SET session_replication_role = replica;` +
		fmt.Sprintf(`UPDATE node_resource_slots SET capacity_metadata = jsonb_set(capacity_metadata, '{fabric_vf_pci_address}', to_jsonb(%s)) WHERE id = %s;`, vfOf("b-shared-vf", 1), slot("b-shared-vf", 2)) +
		`SET session_replication_role = origin;` +
		fmt.Sprintf(`UPDATE node_resource_slots SET status = 'disabled' WHERE id = %s;`, slot("b-shared-vf", 3)) +
		fmt.Sprintf(`UPDATE node_resource_slots SET capacity_metadata = jsonb_set(capacity_metadata, '{fabric_vf_pci_address}', to_jsonb(%s)) WHERE id = %s;`, vfOf("b-shared-vf", 4), slot("b-shared-vf", 3)) +
		// f: one slot each without storage ownership, wipe policy, per-slot VF mode, VF, with another SKU, and disabled.
		meta("f-slot-policies", 0, "storage_ownership", "host_share") + meta("f-slot-policies", 1, "destructive_wipe_policy", "") +
		meta("f-slot-policies", 2, "fabric_claim_mode", "shared_host") + meta("f-slot-policies", 3, "fabric_vf_pci_address", "") +
		meta("f-slot-policies", 4, "sku", "another-sku") +
		fmt.Sprintf(`UPDATE node_resource_slots SET status = 'disabled' WHERE id = %s;`, slot("f-slot-policies", 5)) +
		fmt.Sprintf(`UPDATE nodes SET draining = true WHERE id = '%s';`, ids["g-draining"]) +
		fmt.Sprintf(`UPDATE nodes SET agent_facts = '{"prerequisites": {"ready": false}}' WHERE id = '%s';`, ids["h-not-ready"]) +
		fmt.Sprintf(`UPDATE nodes SET region = 'elsewhere' WHERE id = '%s';`, ids["j-other-region"])
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	// Live claims: c holds slot 0 with slot 5's VF recorded on the claim (slot 5 out by its VF,
	// slot 0 by its state); i holds slots 0-2 and, another allocation, 4 (topology: 4 claimed);
	// d a node-exclusive claim;
	// e a live baremetal allocation.
	claims := []struct {
		node, shape, kind string
		slots             []int
		vf                string
	}{
		{"c-claimed-vf", "gpu_slice", "slot", []int{0}, vfOf("c-claimed-vf", 5)},
		{"i-busy", "gpu_slice", "slot", []int{0, 1, 2}, ""},
		{"i-busy", "gpu_slice", "slot", []int{4}, ""},
		{"d-exclusive", "baremetal", "node_exclusive", nil, "''"},
		{"e-baremetal", "baremetal", "", nil, ""},
	}
	for _, c := range claims {
		q := fmt.Sprintf(`WITH a AS (INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
			SELECT id, 'h200-sxm-slice', '%s', %d, '', '%s', '{}' FROM tenants WHERE name = 'filter' RETURNING id) `, c.shape, max(1, len(c.slots)), ids[c.node])
		switch {
		case c.kind == "node_exclusive":
			q += fmt.Sprintf(`INSERT INTO allocation_resource_claims (allocation_id, node_id, claim_kind, resource_snapshot) SELECT id, '%s', 'node_exclusive', '{}' FROM a`, ids[c.node])
		case c.kind == "slot":
			for _, i := range c.slots {
				if _, err := conn.Exec(ctx, fmt.Sprintf(`UPDATE node_resource_slots SET status = 'reserved' WHERE id = %s`, slot(c.node, i))); err != nil {
					t.Fatal(err)
				}
				vf := c.vf
				if vf == "" {
					vf = vfOf(c.node, i)
				}
				q += fmt.Sprintf(`, c%d AS (INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, fabric_vf_pci_address, resource_snapshot)
					SELECT id, '%s', %s, 'slot', %s, '{}' FROM a) `, i, ids[c.node], slot(c.node, i), vf)
			}
			q += `SELECT 1`
		default:
			q += `SELECT 1 FROM a`
		}
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", c.node, err)
		}
	}
	if _, err := st.RefreshCapacity(ctx); err != nil {
		t.Fatal(err)
	}
	for _, region := range []string{"", "lab"} {
		pq := store.PlacementQuery{SKU: "h200-sxm-slice", Region: region}
		fleet, err := st.SliceCandidates(ctx, pq)
		if err != nil {
			t.Fatal(err)
		}
		var w store.Window
		err = st.InTx(ctx, func(tx *store.Tx) error {
			w, err = tx.SliceWindow(ctx, store.WindowRequest{Query: pq, GPUs: 1, Limit: 100})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		// Nodes the node-level rules exclude are still window nodes (the window is read by
		// the hint), with no candidates and no topology.
		for _, name := range []string{"d-exclusive", "e-baremetal", "h-not-ready"} {
			if !slices.Contains(w.NodeIDs, ids[name]) {
				t.Errorf("region %q: %s is not among the window's nodes %v", region, name, w.NodeIDs)
			}
			if tp, ok := w.Topology[ids[name]]; !ok || tp.ApprovedSlots != 0 {
				t.Errorf("region %q: %s topology %+v (present %v), want present and empty", region, name, tp, ok)
			}
		}
		if got, want := fmt.Sprint(w.Candidates), fmt.Sprint(fleet); got != want {
			t.Fatalf("region %q: the window's candidates\n%v\ndiffer from the fleet-wide filter's\n%v", region, got, want)
		}
		perNode := map[string]int{}
		for _, c := range fleet {
			perNode[c.NodeName]++
		}
		// Every rule above excluded something, and only that (8 slots a node).
		want := map[string]int{"a-plain": 8, "b-shared-vf": 5, "c-claimed-vf": 6, "f-slot-policies": 2, "i-busy": 4}
		if region == "" {
			want["j-other-region"] = 8
		}
		if fmt.Sprint(perNode) != fmt.Sprint(want) {
			t.Fatalf("region %q: candidates per node %v, want %v", region, perNode, want)
		}
		var candNodes []string
		for name := range perNode {
			candNodes = append(candNodes, ids[name])
		}
		topo, err := st.NodeTopologies(ctx, candNodes)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range candNodes {
			if got, want := fmt.Sprint(w.Topology[id]), fmt.Sprint(topo[id]); got != want {
				t.Errorf("node %s: window topology %s, NodeTopologies %s", id, got, want)
			}
		}
		if tp := w.Topology[ids["i-busy"]]; tp.ClaimedSlots != 4 || tp.ApprovedSlots != 8 || tp.Allocations != 2 ||
			fmt.Sprint(tp.Occupants) != "[[0 0 0] [1]]" {
			t.Errorf("i-busy topology %+v, want 8 approved, 4 claimed by 2 allocations: slots 0-2 of NUMA node 0, slot 4 of 1", tp)
		}
		if tp := w.Topology[ids["b-shared-vf"]]; tp.ApprovedSlots != 7 || tp.GroupSize[0] != 3 || tp.GroupSize[1] != 4 {
			t.Errorf("b-shared-vf topology %+v, want 7 approved (slot 3 disabled): 3 + 4", tp)
		}
	}
}
