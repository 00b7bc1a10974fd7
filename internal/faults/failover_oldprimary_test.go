package faults

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gpuaas/gpuaas/internal/pgserver"
)

// After a failover the old primary comes back as a server of its own (not fenced, not
// rejoined as a standby: the failure a failover manager exists to prevent), read-write,
// first in the controllers' multi-host URL. Every connection the controllers hold is then
// cut, so each one they open next chooses a server again: they must stay on the promoted
// standby (the timeline they have written to), never split the brain by writing to the old
// primary. Creates and releases through both replicas land on the new primary only.
func TestDBFailoverOldPrimaryComesBack(t *testing.T) {
	c, pair := newFailoverCluster(t, true, failoverFlags...)
	h := c.addHost([]string{c.A.Server})
	viaA, viaB := c.tenant(c.A.Server), c.tenant(c.B.Server)
	before := createN(t, c, viaA, 2)

	if _, err := pair.primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := pair.standby.Promote(c.ctx); err != nil {
		t.Fatal(err)
	}
	// Both replicas write to the promoted standby (its timeline is the one they follow).
	after := append(createN(t, c, viaA, 1), createN(t, c, viaB, 1)...)
	c.settled(h, viaA, append(before, after...))

	old, err := pgserver.Start(c.ctx, pgserver.Options{Dir: pair.primaryDir, Settings: replicationSettings(false)})
	if err != nil {
		t.Fatalf("restart the old primary as a server of its own: %v", err)
	}
	t.Cleanup(func() { _ = old.Stop() })
	oldDB := pool(t, c.ctx, old.ConnString("postgres"))
	newDB := pool(t, c.ctx, pair.standby.ConnString("postgres"))
	var readOnly string
	if err := oldDB.QueryRow(c.ctx, `SHOW transaction_read_only`).Scan(&readOnly); err != nil || readOnly != "off" {
		t.Fatalf("the old primary should be back read-write (the dangerous case): %q %v", readOnly, err)
	}
	count := func(db *pgxpool.Pool) (n int) {
		if err := db.QueryRow(c.ctx, `SELECT count(*) FROM allocations`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	oldCount := count(oldDB)

	// Cut every connection to the new primary but ours: the controllers' pools and LISTEN
	// connections reconnect through the URL, which names the old primary first.
	var cut int
	if err := newDB.QueryRow(c.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND datname = 'postgres'
		  AND application_name <> 'failover-test'`).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	t.Logf("old primary back read-write with %d allocations; %d connections to the new primary cut", oldCount, cut)
	hc := rawClient(t, c)
	for _, srv := range []string{c.A.Server, c.B.Server} {
		waitFor(t, srv+" /readyz 200 again", 30*time.Second, func() (bool, error) {
			req, _ := http.NewRequestWithContext(c.ctx, "GET", srv+"/readyz", nil)
			resp, err := hc.Do(req)
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, nil
		})
	}
	later := append(createN(t, c, viaA, 2), createN(t, c, viaB, 2)...)
	for _, id := range later {
		var onNew, onOld int
		if err := newDB.QueryRow(c.ctx, `SELECT count(*) FROM allocations WHERE id = $1`, id).Scan(&onNew); err != nil {
			t.Fatal(err)
		}
		if err := oldDB.QueryRow(c.ctx, `SELECT count(*) FROM allocations WHERE id = $1`, id).Scan(&onOld); err != nil {
			t.Fatal(err)
		}
		if onNew != 1 || onOld != 0 {
			t.Fatalf("allocation %s created after the old primary came back: %d on the new primary, %d on the old one; want 1 and 0", id, onNew, onOld)
		}
	}
	for _, id := range later {
		if _, err := viaB.ReleaseAllocation(c.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range later {
		allocStatus(t, viaA, id, 60*time.Second, "released")
	}
	if n := count(oldDB); n != oldCount {
		t.Fatalf("the old primary's allocations went from %d to %d: a controller wrote to it", oldCount, n)
	}
	var others int
	if err := oldDB.QueryRow(c.ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'
		AND pid <> pg_backend_pid() AND application_name <> 'failover-test'`).Scan(&others); err != nil {
		t.Fatal(err)
	}
	if others != 0 {
		t.Fatalf("%d connections besides the test's are open on the old primary; a controller kept one", others)
	}
	t.Logf("after the cut: %d allocations created and released through both replicas, all on the new primary; no connection left on the old one", len(later))
}

// pool is a connection pool to exactly one server (the test's own view, named so the
// connection cut above spares it).
func pool(t *testing.T, ctx context.Context, connString string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(connString + " application_name=failover-test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(fmt.Errorf("pool: %w", err))
	}
	t.Cleanup(p.Close)
	return p
}
