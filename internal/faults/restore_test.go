package faults

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// claimsAndSlots is every allocation's slot claims ("allocation -> sorted slot ids") and
// every slot's status, as the database holds them.
func claimsAndSlots(t *testing.T, ctx context.Context, e *benchenv.Env) (map[string]string, map[string]string) {
	t.Helper()
	claims, slots := map[string][]string{}, map[string]string{}
	rows, err := e.DB.Query(ctx, `SELECT allocation_id::text, slot_id::text FROM allocation_resource_claims WHERE slot_id IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a, s string
		if err := rows.Scan(&a, &s); err != nil {
			t.Fatal(err)
		}
		claims[a] = append(claims[a], s)
	}
	rows.Close()
	rows, err = e.DB.Query(ctx, `SELECT id::text, status FROM node_resource_slots`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			t.Fatal(err)
		}
		slots[id] = st
	}
	rows.Close()
	out := map[string]string{}
	for a, ss := range claims {
		sort.Strings(ss)
		out[a] = strings.Join(ss, ",")
	}
	return out, slots
}

// The restore drill: back up a running control plane (gpuaas-controller backup) while a host
// runs provisioning tasks, let those tasks finish and be acknowledged, destroy the controller,
// its state directory and its database, restore the archive (gpuaas-controller restore) onto
// a fresh state directory and a fresh PostgreSQL, and start the controller on the address the
// host knows. The host reconnects with the CA and task-signing key it pinned (no re-enrolment);
// allocations and slots are as they were; the tasks in flight at backup time, which the
// restored database still has as leased, are reconciled from the results the host kept
// rather than run again; the invariants hold; and new work runs.
func TestRestoreDrill(t *testing.T) {
	c := newCluster(t, 1, "--task-lease", "3s")
	h := c.addHost([]string{c.A.Server}, "--sim-phase-delay", "400ms")
	cl := c.tenant(c.A.Server)

	settledIDs := createN(t, c, cl, 2)
	c.settled(h, cl, settledIDs)
	inFlight := createN(t, c, cl, 2)
	waitFor(t, "both provisioning tasks started on the host", 60*time.Second, func() (bool, error) {
		n := 0
		runs := h.runs()
		for _, id := range inFlight {
			for _, tk := range c.tasksOf(id) {
				if tk.Type == "slice.vm_provision" && runs[tk.ID] > 0 {
					n++
				}
			}
		}
		return n == len(inFlight), nil
	})

	archive := filepath.Join(c.dir, "backup.tar")
	out, err := exec.CommandContext(c.ctx, filepath.Join(binDir, "gpuaas-controller"), "backup", "--state-dir", c.A.StateDir,
		"--database-url", c.A.DBURL, "--out", archive).CombinedOutput()
	if err != nil {
		t.Fatalf("gpuaas-controller backup: %v\n%s", err, out)
	}
	if fi, err := os.Stat(archive); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup archive: %v, mode %v; want a 0600 file", err, fi.Mode().Perm())
	}
	var leasedAtBackup int
	if err := c.A.DB.QueryRow(c.ctx, `SELECT count(*) FROM node_tasks WHERE status = 'leased'`).Scan(&leasedAtBackup); err != nil {
		t.Fatal(err)
	}

	// The in-flight tasks finish and their results are acknowledged by the controller that is
	// about to be lost: the backup does not know them.
	c.settled(h, cl, append(settledIDs, inFlight...))
	wantClaims, wantSlots := claimsAndSlots(t, c.ctx, c.A)
	caPEM, err := os.ReadFile(c.A.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	addr := c.A.Addr()

	// Destroy: the controller (kill -9), its database and its state directory.
	if err := c.A.KillController(); err != nil {
		t.Fatal(err)
	}
	c.A.Store.Close()
	c.A.DB.Close()
	c.A.Store, c.A.DB = nil, nil
	if err := c.A.PG.Stop(); err != nil {
		t.Fatal(err)
	}
	c.A.PG = nil
	for _, d := range []string{c.A.StateDir, filepath.Join(c.A.Dir, "pg")} {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}

	// Restore onto a fresh PostgreSQL and state directory, then serve on the old address.
	rdir := filepath.Join(c.dir, "restored")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		t.Fatal(err)
	}
	pg, err := pgserver.Start(c.ctx, pgserver.Options{Dir: filepath.Join(rdir, "pg")})
	if err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(rdir, "state")
	restore := func(wantOK bool) string {
		t.Helper()
		out, err := exec.CommandContext(c.ctx, filepath.Join(binDir, "gpuaas-controller"), "restore", "--from", archive,
			"--state-dir", stateDir, "--database-url", pg.ConnString("postgres")).CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("gpuaas-controller restore: err %v, want success %v\n%s", err, wantOK, out)
		}
		return string(out)
	}
	restore(true)
	// A second restore onto the now live identity and database is refused, changing nothing.
	if msg := restore(false); !strings.Contains(msg, "fresh state directory") {
		t.Fatalf("second restore: %s", msg)
	}
	if got, _ := os.ReadFile(pki.Paths{Dir: stateDir}.CACert()); !bytes.Equal(got, caPEM) {
		t.Fatal("the restored CA differs from the one hosts pinned")
	}
	r, err := benchenv.Adopt(c.ctx, rdir, pg, stateDir, c.A.Token)
	if err != nil {
		_ = pg.Stop()
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	if err := r.StartController(c.ctx, binDir, append(append([]string(nil), c.flags...), "--listen", addr)...); err != nil {
		t.Fatalf("start the restored controller: %v", err)
	}
	c.A = r // the cluster's helpers (invariants) now read the restored database

	restoredAt := time.Now()
	waitFor(t, "the host to heartbeat to the restored controller", 60*time.Second, func() (bool, error) {
		nd, err := c.admin.GetNode(c.ctx, h.name)
		return err == nil && nd.LastHeartbeatAt != nil && nd.LastHeartbeatAt.After(restoredAt), err
	})
	if leasedAtBackup == 0 {
		t.Fatal("no task was leased when the backup was taken: the drill proved nothing about tasks in flight")
	}
	// The in-flight tasks end succeeded from the results the host kept, each started once.
	c.settled(h, cl, append(settledIDs, inFlight...))
	if b, _ := os.ReadFile(filepath.Join(h.dir, "hostd.log")); !bytes.Contains(b, []byte("its result is reported again")) {
		t.Fatal("the host never reported a kept result again: the drill did not exercise reconciliation")
	}
	gotClaims, gotSlots := claimsAndSlots(t, c.ctx, r)
	for a, want := range wantClaims {
		if gotClaims[a] != want {
			t.Errorf("allocation %s claims %q after restore, want %q", a, gotClaims[a], want)
		}
	}
	for s, want := range wantSlots {
		if gotSlots[s] != want {
			t.Errorf("slot %s is %q after restore, want %q", s, gotSlots[s], want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// New work reaches the host, signed with the restored key it pinned.
	more := createN(t, c, cl, 1)
	c.settled(h, cl, append(append(settledIDs, inFlight...), more...))
}
