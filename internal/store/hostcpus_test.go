package store_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/store"
)

// refusedAs checks that err is the database's refusal, translated: a conflict or invalid
// DBError whose Detail is want, in our words (no SQL text).
func refusedAs(t *testing.T, what string, err error, kind error, want string) {
	t.Helper()
	var dbe *store.DBError
	if !errors.As(err, &dbe) || !errors.Is(err, kind) {
		t.Fatalf("%s: err %v (%T); want a %v refusal %q", what, err, err, kind, want)
	}
	if dbe.Detail != want || strings.Contains(strings.ToLower(dbe.Detail), "relation") {
		t.Fatalf("%s: detail %q; want %q", what, dbe.Detail, want)
	}
}

// Two enabled slots of one node never share a host CPU, whatever writes them: a slot map
// applied without the API's checks, plain SQL, or a disabled slot enabled again after another
// slot took its CPUs. Each refusal names the slot that holds the CPUs.
func TestSlotHostCPUsOverlapRefused(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "cpus-a", 60) // fixtures: slot 0 owns 0-11,96-107, slot 1 12-23,108-119
	m := fixtures.H200SlotMap(60)
	m[1].HostCPUs = "11-22,108-119" // CPU 11 is slot 0's
	err := st.InTx(ctx, func(tx *store.Tx) error { _, err := tx.ApplySlots(ctx, n.ID, m, false); return err })
	refusedAs(t, "apply", err, store.ErrConflict, "slot 1 cannot own host CPUs 11: slot 0 holds them")

	conn := connect(t, url)
	_, err = conn.Exec(ctx, `UPDATE node_resource_slots SET host_cpus = '{5,6,200}', vcpu_count = 3 WHERE node_id = $1 AND slot_index = 3`, n.ID)
	refusedAs(t, "sql", store.Translate(err), store.ErrConflict, "slot 3 cannot own host CPUs 5,6: slot 0 holds them")

	// A disabled slot's CPUs may be taken; enabling it again is then refused.
	err = st.InTx(ctx, func(tx *store.Tx) error { _, err := tx.SetSlotEnabled(ctx, n.ID, 1, false, "test"); return err })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET host_cpus = host_cpus || '{12}' WHERE node_id = $1 AND slot_index = 2`, n.ID); err != nil {
		t.Fatalf("taking a disabled slot's CPU: %v", err)
	}
	err = st.InTx(ctx, func(tx *store.Tx) error { _, err := tx.SetSlotEnabled(ctx, n.ID, 1, true, ""); return err })
	refusedAs(t, "enable", err, store.ErrConflict, "slot 1 cannot own host CPUs 12: slot 2 holds them")

	// A new slot (insert) on another node may reuse the numbers: the sets are per node.
	n2 := addNode(t, st, "cpus-b", 61)
	if n2.ID == n.ID {
		t.Fatal("one node")
	}
}

// A slot never asks for more vCPUs than it owns host CPUs, and never owns a housekeeping CPU;
// a housekeeping set that takes an enabled slot's CPU is refused too.
func TestSlotHostCPUsVCPUsAndHousekeeping(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "cpus-c", 62)
	conn := connect(t, url)
	_, err := conn.Exec(ctx, `UPDATE node_resource_slots SET vcpu_count = 25 WHERE node_id = $1 AND slot_index = 4`, n.ID)
	refusedAs(t, "vcpus", store.Translate(err), store.ErrInvalid, "slot 4 asks for 25 vCPUs but owns only 24 host CPUs: lower its vcpu_count or give it more CPUs")

	err = st.InTx(ctx, func(tx *store.Tx) error { return tx.SetHousekeeping(ctx, n.ID, []int{0, 96, 191}) })
	refusedAs(t, "housekeeping", err, store.ErrConflict, "housekeeping CPUs 0,96 are slot 0's host CPUs")

	// Free slot 7's last core for the host, then the slot may not take it back.
	m := fixtures.H200SlotMap(62)
	m[7].HostCPUs, m[7].VCPUCount = "84-94,180-190", ptr(22)
	err = st.InTx(ctx, func(tx *store.Tx) error {
		if _, err := tx.ApplySlots(ctx, n.ID, m, false); err != nil {
			return err
		}
		return tx.SetHousekeeping(ctx, n.ID, []int{95, 191})
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `UPDATE node_resource_slots SET host_cpus = host_cpus || '{95}' WHERE node_id = $1 AND slot_index = 7`, n.ID)
	refusedAs(t, "slot takes housekeeping", store.Translate(err), store.ErrConflict, "slot 7 cannot own host CPUs 95: they are the node's housekeeping CPUs")
	var hk []int
	err = st.InTx(ctx, func(tx *store.Tx) error { hk, _, err = tx.Housekeeping(ctx, n.ID); return err })
	if err != nil || len(hk) != 2 || hk[0] != 95 || hk[1] != 191 {
		t.Fatalf("housekeeping = %v, %v", hk, err)
	}
	sl, err := st.ListSlots(ctx, n.ID)
	if err != nil || sl[7].HostCPUs != "84-94,180-190" || sl[0].HostCPUs != "0-11,96-107" {
		t.Fatalf("slots read back: %+v, %v", sl, err)
	}
}

// The check runs only when a slot's CPU set or vCPU count changes, a slot is added, or a slot
// leaves 'disabled': a reservation's or release's status change never runs it. Seen here on a
// node whose slots overlap (written with triggers off, as no writer can): status changes
// pass; a change of the set is refused.
func TestSlotHostCPUsCheckSkipsStatusChanges(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "cpus-d", 63)
	conn := connect(t, url)
	if _, err := conn.Exec(ctx, `SET session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET host_cpus = '{0,1}' WHERE node_id = $1 AND slot_index IN (0, 1)`, n.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET session_replication_role = origin`); err != nil {
		t.Fatal(err)
	}
	for _, status := range []string{"reserved", "available", "reserved", "provisioning", "active", "releasing", "cleanup"} {
		if _, err := conn.Exec(ctx, `UPDATE node_resource_slots SET status = $2 WHERE node_id = $1 AND slot_index IN (0, 1)`, n.ID, status); err != nil {
			t.Fatalf("status %s: %v", status, err)
		}
	}
	_, err := conn.Exec(ctx, `UPDATE node_resource_slots SET host_cpus = '{0,1,2}', vcpu_count = 3 WHERE node_id = $1 AND slot_index = 1`, n.ID)
	refusedAs(t, "set change", store.Translate(err), store.ErrConflict, "slot 1 cannot own host CPUs 0,1: slot 0 holds them")
}

// Two transactions that each give a different slot of one node the same free CPU, committing
// at the same moment: the check locks the node row, so they check one after the other and
// exactly one commits; the other is refused naming the winner's slot. A third transaction
// holds the node row until both commits are waiting on it.
func TestSlotHostCPUsConcurrentClaimsOneWins(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	n := addNode(t, st, "cpus-e", 64)
	holder, watch := connect(t, url), connect(t, url)
	htx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := htx.Exec(ctx, `SELECT 1 FROM nodes WHERE id = $1 FOR UPDATE`, n.ID); err != nil {
		t.Fatal(err)
	}
	var pids []uint32
	txs := make([]pgx.Tx, 2)
	for i, index := range []int{2, 5} {
		c := connect(t, url)
		pids = append(pids, c.PgConn().PID())
		if txs[i], err = c.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := txs[i].Exec(ctx, `UPDATE node_resource_slots SET host_cpus = host_cpus || '{500}' WHERE node_id = $1 AND slot_index = $2`, n.ID, index); err != nil {
			t.Fatalf("slot %d: %v (the check runs at commit)", index, err)
		}
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range txs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = store.Translate(txs[i].Commit(ctx)) }()
	}
	// Both commits wait on the node row lock.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND wait_event_type = 'Lock'`, pids).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 commits wait on the node row lock; want both", waiting)
		}
		runtime.Gosched()
	}
	if err := htx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	won, lost := -1, -1
	for i, e := range errs {
		if e == nil {
			won = i
		} else {
			lost = i
		}
	}
	if won < 0 || lost < 0 {
		t.Fatalf("commits: %v; want exactly one to win", errs)
	}
	slotOf := []int{2, 5}
	refusedAs(t, "the second commit", errs[lost], store.ErrConflict,
		fmt.Sprintf("slot %d cannot own host CPUs 500: slot %d holds them", slotOf[lost], slotOf[won]))
}
