package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/store"
)

// identityRefused fails unless err is the database refusing a shared identity with a message
// that names the holder.
func identityRefused(t *testing.T, err error, holder string) {
	t.Helper()
	var pgErr *pgconn.PgError
	var dbe *store.DBError
	switch {
	case errors.As(err, &dbe):
		if !errors.Is(err, store.ErrConflict) || !strings.HasPrefix(dbe.Constraint, "slot_identity_") || !strings.Contains(dbe.Detail, holder) {
			t.Fatalf("want a slot_identity conflict naming %q, got %v", holder, err)
		}
	case errors.As(err, &pgErr):
		if pgErr.Code != "23505" || !strings.HasPrefix(pgErr.ConstraintName, "slot_identity_") || !strings.Contains(pgErr.Message, holder) {
			t.Fatalf("want a slot_identity unique violation naming %q, got %v", holder, err)
		}
	default:
		t.Fatalf("want the shared identity refused naming %q, got %v", holder, err)
	}
}

func apply(st *store.Store, nodeID string, specs []apiv1.SlotSpec, dryRun bool) error {
	return st.InTx(context.Background(), func(tx *store.Tx) error {
		_, err := tx.ApplySlots(context.Background(), nodeID, specs, dryRun)
		return err
	})
}

func setEnabled(st *store.Store, nodeID string, idx int, enabled bool) error {
	return st.InTx(context.Background(), func(tx *store.Tx) error {
		_, err := tx.SetSlotEnabled(context.Background(), nodeID, idx, enabled, "test")
		return err
	})
}

// Within a node a GPU, a fabric VF (one PCI namespace with the GPUs), an NVMe device and a
// private IP belong to one enabled slot, whatever writes them: a slot map through the store
// or plain SQL. Other nodes may name the same ones (they are that node's own devices and its
// own slice network), a disabled slot holds nothing, and empty values are no identity.
func TestNodeIdentitiesBelongToOneSlot(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	a := addNode(t, st, "ident-a", 1)
	b := addNode(t, st, "ident-b", 2)
	conn := connect(t, url)
	vf0 := fixtures.H200Slot(1, 0).CapacityMetadata["fabric_vf_pci_address"].(string)
	// Every fixture node names the same GPU and VF PCI addresses (each host its own devices),
	// so ident-b's map already shows those may repeat across nodes; the cases with crossNode
	// show it for NVMe names and private IPs.
	cases := []struct {
		name      string
		set       string // SQL assignment giving slot 1 slot 0's identity
		edit      func(*apiv1.SlotSpec)
		crossNode bool
	}{
		{"gpu", `pci_address = '0000:1B:00.0'`, func(s *apiv1.SlotSpec) { s.PCIAddress = fixtures.H200GPUs[0] }, false},
		{"fabric vf", `capacity_metadata = capacity_metadata || '{"fabric_vf_pci_address": "` + vf0 + `"}'`,
			func(s *apiv1.SlotSpec) { s.CapacityMetadata["fabric_vf_pci_address"] = vf0 }, false},
		{"vf named as a gpu", `pci_address = '` + vf0 + `'`, func(s *apiv1.SlotSpec) { s.PCIAddress = vf0 }, false},
		{"nvme", `nvme_device = '` + fixtures.H200Slot(1, 0).NVMeDevice + `'`,
			func(s *apiv1.SlotSpec) { s.NVMeDevice = fixtures.H200Slot(1, 0).NVMeDevice }, true},
		{"private ip", `private_ip = '10.100.1.10/24'`, func(s *apiv1.SlotSpec) { s.PrivateIP = "10.100.1.10" }, true},
		{"nvme partition of slot 0's disk", `nvme_device = '` + fixtures.H200Slot(1, 0).NVMeDevice + `-part1'`,
			func(s *apiv1.SlotSpec) { s.NVMeDevice = fixtures.H200Slot(1, 0).NVMeDevice + "-part1" }, false},
	}
	for _, c := range cases {
		_, err := conn.Exec(ctx, `UPDATE node_resource_slots SET `+c.set+` WHERE node_id = $1 AND slot_index = 1`, a.ID)
		identityRefused(t, err, "slot 0 on node ident-a")
		m := fixtures.H200SlotMap(1)
		c.edit(&m[1])
		identityRefused(t, apply(st, a.ID, m, false), "slot 0 on node ident-a")
		if !c.crossNode {
			continue
		}
		m = fixtures.H200SlotMap(2)
		c.edit(&m[1])
		if err := apply(st, b.ID, m, false); err != nil {
			t.Fatalf("%s: node ident-b naming what ident-a's slot 0 names: %v", c.name, err)
		}
		if err := apply(st, b.ID, fixtures.H200SlotMap(2), false); err != nil {
			t.Fatal(err)
		}
	}
	// A disabled slot holds nothing; empty values are no identity.
	if err := setEnabled(st, a.ID, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET pci_address = '0000:1b:00.0', nvme_device = '', private_ip = NULL,
		capacity_metadata = capacity_metadata - 'fabric_vf_pci_address' WHERE node_id = $1 AND slot_index = 1`, a.ID); err != nil {
		t.Fatalf("slot 1 taking disabled slot 0's GPU: %v", err)
	}
	if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET nvme_device = '', private_ip = NULL,
		capacity_metadata = capacity_metadata - 'fabric_vf_pci_address' WHERE node_id = $1 AND slot_index = 2`, a.ID); err != nil {
		t.Fatalf("two slots without NVMe, IP or VF: %v", err)
	}
}

// A MAC address is unique in the fleet, compared without regard to case or separators; a slot
// map naming one another node holds is refused, on a dry run too, naming every holder.
func TestMACIsUniqueInTheFleet(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	a := addNode(t, st, "mac-a", 3)
	b := addNode(t, st, "mac-b", 4)
	conn := connect(t, url)
	macA0 := fixtures.H200Slot(3, 0).MACAddress
	_, err := conn.Exec(ctx, `UPDATE node_resource_slots SET mac_address = $2 WHERE node_id = $1 AND slot_index = 5`,
		b.ID, strings.ToUpper(strings.ReplaceAll(macA0, ":", "-")))
	identityRefused(t, err, "slot 0 on node mac-a")
	_, err = conn.Exec(ctx, `INSERT INTO node_resource_slots (node_id, slot_index, mac_address) VALUES ($1, 9, $2)`, b.ID, macA0)
	identityRefused(t, err, "slot 0 on node mac-a")

	m := fixtures.H200SlotMap(4)
	m[5].MACAddress = macA0
	m[6].MACAddress = fixtures.H200Slot(3, 2).MACAddress
	for _, dry := range []bool{true, false} {
		err := apply(st, b.ID, m, dry)
		identityRefused(t, err, "slot 5 on node mac-b: mac_address "+macA0+" is already held by slot 0 on node mac-a")
		identityRefused(t, err, "slot 6 on node mac-b: mac_address "+m[6].MACAddress+" is already held by slot 2 on node mac-a")
	}
	holders, err := st.MACHolders(ctx, b.ID, []string{strings.ToUpper(macA0)})
	if err != nil || holders[store.MACKey(macA0)] != "slot 0 on node mac-a" {
		t.Fatalf("MACHolders = %v, %v", holders, err)
	}
	slots, err := st.ListSlots(ctx, b.ID)
	if err != nil || slots[5].MACAddress != fixtures.H200Slot(4, 5).MACAddress {
		t.Fatalf("a refused map changed node mac-b: %+v %v", slots[5], err)
	}
	// Removed from a's map (disabled), the MAC is free for b.
	if err := apply(st, a.ID, fixtures.H200SlotMap(3)[1:], false); err != nil {
		t.Fatal(err)
	}
	m[6].MACAddress = fixtures.H200Slot(4, 6).MACAddress
	if err := apply(st, b.ID, m, false); err != nil {
		t.Fatalf("taking a disabled slot's MAC: %v", err)
	}
}

// Enabling a disabled slot re-checks its identities: one another slot took meanwhile (on the
// node, or a MAC anywhere) keeps it disabled, and the refusal names the holder.
func TestEnableRechecksIdentitiesTakenMeanwhile(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	a := addNode(t, st, "enable-a", 5)
	b := addNode(t, st, "enable-b", 6)
	conn := connect(t, url)
	for _, i := range []int{0, 1} {
		if err := setEnabled(st, a.ID, i, false); err != nil {
			t.Fatal(err)
		}
	}
	m := fixtures.H200SlotMap(6)
	m[3].MACAddress = fixtures.H200Slot(5, 0).MACAddress
	if err := apply(st, b.ID, m, false); err != nil {
		t.Fatalf("taking a disabled slot's MAC: %v", err)
	}
	identityRefused(t, setEnabled(st, a.ID, 0, true), "slot 3 on node enable-b")
	if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET nvme_device = $2 WHERE node_id = $1 AND slot_index = 2`,
		a.ID, fixtures.H200Slot(5, 1).NVMeDevice); err != nil {
		t.Fatal(err)
	}
	identityRefused(t, setEnabled(st, a.ID, 1, true), "slot 2 on node enable-a")
	// Plain SQL takes the same check.
	_, err := conn.Exec(ctx, `UPDATE node_resource_slots SET status = 'available' WHERE node_id = $1 AND slot_index = 1`, a.ID)
	identityRefused(t, err, "slot 2 on node enable-a")
	slots, err := st.ListSlots(ctx, a.ID)
	if err != nil || slots[0].Status != "disabled" || slots[1].Status != "disabled" {
		t.Fatalf("refused enables left slots %s, %s (%v)", slots[0].Status, slots[1].Status, err)
	}
}

// One slot map may swap identities between its slots (the checks see the whole map), and so
// may one SQL statement.
func TestSlotMapMaySwapIdentities(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	a := addNode(t, st, "swap-a", 7)
	m := fixtures.H200SlotMap(7)
	m[0].PCIAddress, m[1].PCIAddress = m[1].PCIAddress, m[0].PCIAddress
	m[0].NVMeDevice, m[1].NVMeDevice = m[1].NVMeDevice, m[0].NVMeDevice
	m[0].MACAddress, m[1].MACAddress = m[1].MACAddress, m[0].MACAddress
	m[0].PrivateIP, m[1].PrivateIP = m[1].PrivateIP, m[0].PrivateIP
	m[0].CapacityMetadata["fabric_vf_pci_address"], m[1].CapacityMetadata["fabric_vf_pci_address"] =
		m[1].CapacityMetadata["fabric_vf_pci_address"], m[0].CapacityMetadata["fabric_vf_pci_address"]
	// A three-way rotation of the GPUs too.
	m[2].PCIAddress, m[3].PCIAddress, m[4].PCIAddress = m[3].PCIAddress, m[4].PCIAddress, m[2].PCIAddress
	if err := apply(st, a.ID, m, false); err != nil {
		t.Fatalf("swapping identities within one map: %v", err)
	}
	slots, err := st.ListSlots(ctx, a.ID)
	if err != nil || slots[0].PCIAddress != fixtures.H200GPUs[1] || slots[1].MACAddress != fixtures.H200Slot(7, 0).MACAddress ||
		slots[2].PCIAddress != fixtures.H200GPUs[3] {
		t.Fatalf("after the swap: %+v %v", slots[:3], err)
	}
	conn := connect(t, url)
	if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET mac_address = CASE slot_index WHEN 0 THEN $2 ELSE $3 END
		WHERE node_id = $1 AND slot_index IN (0, 1)`, a.ID, fixtures.H200Slot(7, 0).MACAddress, fixtures.H200Slot(7, 1).MACAddress); err != nil {
		t.Fatalf("swapping MACs in one statement: %v", err)
	}
	// A map that leaves two slots on one GPU is still refused, naming both.
	m[5].PCIAddress = m[6].PCIAddress
	identityRefused(t, apply(st, a.ID, m, false), "slot 5 on node swap-a")
}

// Concurrent writers of one identity serialise: while one transaction holds a MAC (on its own
// node) or a GPU (on the same node), another waits, and once the first commits it is refused.
func TestConcurrentIdentityWritersSerialise(t *testing.T) {
	st, url := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := addNode(t, st, "conc-a", 8)
	b := addNode(t, st, "conc-b", 9)
	for _, c := range []struct {
		name, gpu, firstMAC, secondMAC, secondNode string
		firstIndex, secondIndex                    int
	}{
		// Node conc-b may name the same GPU (its own), not the same MAC.
		{"mac on two nodes", "0000:f1:00.0", "52:54:00:ee:ee:01", "52:54:00:ee:ee:01", b.ID, 9, 10},
		{"gpu on one node", "0000:f2:00.0", "52:54:00:ee:ee:02", "52:54:00:ee:ee:03", a.ID, 11, 12},
	} {
		first, second := connect(t, url), connect(t, url)
		tx1, err := first.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx1.Exec(ctx, `INSERT INTO node_resource_slots (node_id, slot_index, pci_address, mac_address) VALUES ($1, $2, $3, $4)`,
			a.ID, c.firstIndex, c.gpu, c.firstMAC); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := second.Exec(ctx, `INSERT INTO node_resource_slots (node_id, slot_index, pci_address, mac_address) VALUES ($1, $2, $3, $4)`,
				c.secondNode, c.secondIndex, c.gpu, c.secondMAC)
			done <- err
		}()
		waitBlockedBy(ctx, t, connect(t, url), first.PgConn().PID())
		if err := tx1.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		identityRefused(t, <-done, fmt.Sprintf("slot %d on node conc-a", c.firstIndex))
	}

	// Many slot maps at once, each on its own node, all naming one MAC: exactly one wins.
	const n = 6
	nodes := make([]string, n)
	for i := range nodes {
		nodes[i] = addNode(t, st, fmt.Sprintf("race-%d", i), 20+i).ID
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := fixtures.H200SlotMap(20 + i)
			m[7].MACAddress = "52:54:00:ee:ee:ff"
			errs[i] = apply(st, nodes[i], m, false)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else {
			identityRefused(t, err, "is already held by slot 7 on node race-")
		}
	}
	if won != 1 {
		t.Fatalf("%d of %d concurrent maps naming one MAC were applied: %v", won, n, errs)
	}
}

// waitBlockedBy polls until some session waits on a lock pid holds.
func waitBlockedBy(ctx context.Context, t *testing.T, probe *pgx.Conn, pid uint32) {
	t.Helper()
	for {
		var blocked bool
		if err := probe.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the second writer never waited for the first")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A shared identity written before migration 017 (here with the session's triggers off, and
// the device snapshot migration 034 gives every slot) is reported by Invariants; and a check refuses to run under REPEATABLE READ or SERIALIZABLE,
// whose snapshot, older than the check's lock, could miss a concurrent writer of the same
// identity.
func TestLegacySharedIdentityReportedAndRepeatableReadRefused(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	a := addNode(t, st, "legacy-a", 10)
	conn := connect(t, url)
	nvme := fixtures.H200Slot(10, 0).NVMeDevice
	for _, q := range []string{`SET session_replication_role = replica`,
		`UPDATE node_resource_slots SET nvme_device = '` + nvme + `' WHERE node_id = '` + a.ID + `' AND slot_index = 1`,
		`WITH d AS (INSERT INTO slot_device_snapshots (slot_id, snapshot) SELECT s.id, slot_device_snapshot(s) FROM node_resource_slots s
			WHERE s.node_id = '` + a.ID + `' AND s.slot_index = 1 RETURNING id, slot_id)
		UPDATE node_resource_slots s SET device_snapshot_id = d.id FROM d WHERE s.id = d.slot_id`,
		`SET session_replication_role = origin`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	v, err := st.Invariants(ctx)
	want := "device identity held by two enabled slots: node " + a.ID + " nvme " + nvme + " legacy-a/0, legacy-a/1"
	if err != nil || len(v) != 1 || v[0] != want {
		t.Fatalf("invariants = %q, %v; want [%q]", v, err, want)
	}

	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, `UPDATE node_resource_slots SET mac_address = '52:54:00:ee:00:02' WHERE node_id = $1 AND slot_index = 2`, a.ID)
		_ = tx.Rollback(ctx)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "0A000" || !strings.Contains(pgErr.Message, "READ COMMITTED isolation only") {
			t.Fatalf("an identity write under %s: %v; want it refused", iso, err)
		}
	}
}
