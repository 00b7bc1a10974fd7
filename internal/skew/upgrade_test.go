package skew

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/store"
)

// A rolling upgrade from the previous release (release/PREVIOUS) to this tree under load:
// two controller replicas and two sim hosts start on the previous release's binaries with
// three tenants creating, using and releasing allocations throughout. Then, one process at a
// time: replica A is replaced by this tree's controller, which migrates the database while
// replica B, still the previous release, keeps serving on the migrated schema (an
// allocation made through B alone, and one through new A on the old hosts, each run
// end to end); replica B is replaced; each host's hostd is replaced and its heartbeat then
// reports its task schemas. Every allocation the load made ends released, none failed; each
// provisioning task was started exactly once by its host; the invariants hold.
func TestRollingUpgradeFromPreviousRelease(t *testing.T) {
	start0 := time.Now()
	work := t.TempDir()
	oldBin, newBin, oldVersion := binaries(t, work)
	built := time.Since(start0)

	p := start(t, oldBin)
	p.replicaB(oldBin)
	hosts := []*host{p.addHost(oldBin), p.addHost(oldBin)}
	oldSchema, err := store.SchemaVersion(p.ctx, p.A.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		if v, schemas := p.reports(h); !strings.HasPrefix(v, oldVersion) || schemas {
			t.Fatalf("%s reports version %q, task schemas %v: want the previous release %s, which reports no schemas", h.name, v, schemas, oldVersion)
		}
	}
	l := p.startLoad(3)
	l.progress(t, "with everything on "+oldVersion, 3)

	// 1. Replica A to this release: it migrates while B (previous release) serves.
	p.upgrade(p.A, newBin)
	newSchema, err := store.SchemaVersion(p.ctx, p.A.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(repoRoot, "internal", "store", "migrations", "*.sql"))
	if int(newSchema) != len(files) || newSchema <= oldSchema {
		t.Fatalf("schema %d after the new controller started (was %d); want %d", newSchema, oldSchema, len(files))
	}
	only := func(server string) *client.Client {
		cl, err := client.New(client.Options{Server: server, CAFile: p.A.CAFile, Token: p.A.Token})
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	if _, err := lifecycle(p.ctx, only(p.B.Server), "through-old-B"); err != nil {
		t.Fatalf("the previous release's replica on the migrated schema: %v", err)
	}
	newA, err := lifecycle(p.ctx, only(p.A.Server), "through-new-A")
	if err != nil {
		t.Fatalf("this release's controller with the previous release's hosts: %v", err)
	}
	// The previous release reads a claim's devices from the claim's own snapshot: one written
	// by this release carries it while the previous release may run.
	if a, err := only(p.B.Server).GetAllocation(p.ctx, newA); err != nil || len(a.Claims) == 0 || a.Claims[0].PrivateIP == "" || a.Claims[0].SlotIndex == nil {
		t.Fatalf("the previous release reads allocation %s made by this release with claims %+v (%v): want their devices (a tenant sees the private IP)", newA, a.Claims, err)
	}
	// It reads the allocation's profile, image and price from the allocation's own columns:
	// this release fills them as well as the snapshot row while the previous release may run.
	old, errB := only(p.B.Server).GetAllocation(p.ctx, newA)
	cur, errA := only(p.A.Server).GetAllocation(p.ctx, newA)
	if errA != nil || errB != nil || cur.Profile.Name == "" || cur.Image == nil || cur.Price.Currency == "" ||
		!reflect.DeepEqual(old.Profile, cur.Profile) || !reflect.DeepEqual(old.Image, cur.Image) || old.Price != cur.Price {
		t.Fatalf("allocation %s made by this release: the previous release reads profile %+v, image %+v, price %+v (%v); this release %+v, %+v, %+v (%v)",
			newA, old.Profile, old.Image, old.Price, errB, cur.Profile, cur.Image, cur.Price, errA)
	}
	l.progress(t, "with A new and B "+oldVersion+" on the migrated schema", 3)

	// 2. Replica B to this release.
	p.upgrade(p.B, newBin)
	l.progress(t, "with both controllers new and the hosts "+oldVersion, 3)

	// 3. Hosts, one at a time.
	for _, h := range hosts {
		h.upgrade(newBin)
		waitFor(t, h.name+" to report this release and its task schemas", 60*time.Second, func() (bool, error) {
			v, schemas := p.reports(h)
			return strings.HasPrefix(v, "skew-new") && schemas, nil
		})
		l.progress(t, "after upgrading "+h.name, 2)
	}

	// Stop the load; finish what it left in flight; check every allocation.
	l.stop()
	l.wg.Wait()
	if len(l.errs) > 0 {
		t.Fatalf("allocation lifecycles failed: %v", l.errs)
	}
	all, err := p.admin.ListAllocations(p.ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range all {
		switch a.Status {
		case "released":
		case "failed":
			t.Fatalf("allocation %s failed: %s", a.ID, a.FailureReason)
		default:
			waitFor(t, "allocation "+a.ID+" in flight at the end to settle", 60*time.Second, func() (bool, error) {
				got, err := p.admin.GetAllocation(p.ctx, a.ID)
				return err == nil && (got.Status == "active" || got.Status == "released"), err
			})
			if _, err := p.admin.ReleaseAllocation(p.ctx, a.ID); err != nil && !strings.Contains(err.Error(), "releas") {
				t.Fatal(err)
			}
		}
	}
	runs := p.runs()
	for _, a := range all {
		waitFor(t, "allocation "+a.ID+" to be released", 60*time.Second, func() (bool, error) {
			got, err := p.admin.GetAllocation(p.ctx, a.ID)
			return err == nil && got.Status == "released", err
		})
		tasks, err := p.admin.ListTasks(p.ctx, "", a.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range tasks {
			if tk.Type == "slice.vm_provision" && (tk.Status != "succeeded" || runs[tk.ID] != 1) {
				t.Fatalf("allocation %s: provisioning task %s is %s, started %d times by its host; want succeeded, once", a.ID, tk.ID, tk.Status, runs[tk.ID])
			}
		}
	}
	bad, err := p.A.Store.Invariants(p.ctx)
	if err != nil || len(bad) > 0 {
		t.Fatalf("invariants: %v %v", bad, err)
	}
	t.Logf("rolling upgrade %s -> this tree: %d allocations, all released, none failed; binaries built in %s, whole test %s",
		oldVersion, len(all), built.Round(time.Second), time.Since(start0).Round(time.Second))
}
