package faults

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// With asynchronous replication a commit is acknowledged once the primary alone has it, so
// a failover loses whatever the standby had not received. This measures that, and does not
// assert it away: the standby's stream is cut (as a standby that has fallen behind) while
// the load goes on for ten more acknowledged creates, then the primary is killed and the
// standby promoted. It prints how many acknowledged creates and releases the new primary
// lacks, what their owners were told afterwards (not_found), what the hosts did for them
// (tasks the database no longer has; their results rejected and dropped), and that the
// slots they held are on sale again. Everything the new primary does have must still be
// whole: invariants, each host task run once, no task expired for want of a result a host
// held (hosts send it again), controllers back without a restart.
func TestDBFailoverAsynchronousStandby(t *testing.T) {
	// Leases of 10 s: a task whose result the database lost is handed out again 10 s after
	// the failover, and its host sends the result again.
	c, pair := newFailoverCluster(t, false, "--task-lease", "10s")
	var hosts []*host
	for i := 0; i < 6; i++ {
		hosts = append(hosts, c.addHost([]string{c.A.Server}, "--poll-wait", "60s"))
	}
	pidA, pidB := c.A.PID(), c.B.PID()
	standby := pool(t, c.ctx, pair.standby.ConnString("postgres"))
	primary := pool(t, c.ctx, pair.primary.ConnString("postgres"))
	var cutAt time.Time
	r := failoverUnderLoad(t, c, pair, func(l *ledger) {
		// Stop the standby's WAL receiver: from here on only the primary has the commits.
		if _, err := standby.Exec(c.ctx, `ALTER SYSTEM SET primary_conninfo = ''`); err != nil {
			t.Fatal(err)
		}
		if _, err := standby.Exec(c.ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the standby to stop streaming", 30*time.Second, func() (bool, error) {
			var n int
			err := primary.QueryRow(c.ctx, `SELECT count(*) FROM pg_stat_replication`).Scan(&n)
			return err == nil && n == 0, err
		})
		cutAt = time.Now()
		waitFor(t, "ten creates acknowledged by the primary alone", time.Minute, func() (bool, error) {
			return l.count("create", cutAt) >= 10, nil
		})
	})
	// What is lost: acknowledged actions the new primary does not have.
	lostIDs := map[string]bool{}
	var lostCreates, lostReleases, ackedAfterCut int
	var again []string // allocations whose acknowledged release the database lost
	for _, a := range r.acks {
		if a.at.After(cutAt) && a.at.Before(r.kill) {
			ackedAfterCut++
		}
		var status string
		err := c.A.DB.QueryRow(c.ctx, `SELECT status FROM allocations WHERE id = $1`, a.id).Scan(&status)
		switch {
		case err != nil && a.op == "create":
			lostCreates++
			lostIDs[a.id] = true
		case a.op == "release" && !lostIDs[a.id] && status != "releasing" && status != "released":
			lostReleases++
			again = append(again, a.id)
		}
	}
	kinds := checkFailures(t, r.failures, lostIDs)
	// The tenant sees such an allocation active again (at once, or once its host has sent
	// the provisioning result the database lost as well) and releases it again: its VM is
	// already gone and its disks wiped, the host ran the lost release.
	viaA := c.tenant(c.A.Server)
	releasedAgain := map[string]bool{}
	releaseAgain := func() error {
		for _, id := range again {
			if releasedAgain[id] {
				continue
			}
			a, err := viaA.GetAllocation(c.ctx, id)
			if err != nil {
				return err
			}
			if a.Status == "active" {
				if _, err := viaA.ReleaseAllocation(c.ctx, id); err != nil {
					return fmt.Errorf("release again %s: %w", id, err)
				}
				releasedAgain[id] = true
			}
		}
		return nil
	}
	// Tasks whose result the database lost are handed out again; the host refuses to run
	// them twice and sends the result it kept. A result the database kept without its
	// effect on the allocation is applied again by the reaper (after 30 s).
	settle := time.Now()
	waitFor(t, "every allocation the new primary has to come to rest", 4*time.Minute, func() (bool, error) {
		if err := releaseAgain(); err != nil {
			return false, err
		}
		var moving []string
		rows, err := c.A.DB.Query(c.ctx, `SELECT a.id::text || ' ' || a.status || coalesce(' ' || (SELECT string_agg(type || ' ' || status || ' attempt ' || attempt, ', ')
			FROM node_tasks WHERE allocation_id = a.id AND status IN ('queued', 'leased')), '') FROM allocations a WHERE a.status NOT IN ('released', 'failed')`)
		if err != nil {
			return false, err
		}
		defer rows.Close()
		for rows.Next() {
			var m string
			if err := rows.Scan(&m); err != nil {
				return false, err
			}
			moving = append(moving, m)
		}
		if len(moving) > 0 {
			return false, fmt.Errorf("still moving: %v", moving)
		}
		return true, rows.Err()
	})
	settled := time.Since(settle)
	for _, h := range hosts {
		waitFor(t, h.name+"'s spool to drain", time.Minute, func() (bool, error) { return h.spooled() == 0, nil })
	}
	if c.A.PID() != pidA || c.B.PID() != pidB {
		t.Fatal("a controller replica was restarted; both must follow the new primary by themselves")
	}
	c.checkInvariants()
	// Host work the database lost: tasks a host ran that the new primary has never heard of.
	var unknown, dropped, replays int
	rejected := regexp.MustCompile(`msg="result rejected; dropping"`)
	replayed := regexp.MustCompile(`msg="task refused" .* reason=replay`)
	for _, h := range hosts {
		for id, n := range h.runs() {
			if n != 1 {
				t.Fatalf("%s started task %s %d times; want once", h.name, id, n)
			}
			var known int
			if err := c.A.DB.QueryRow(c.ctx, `SELECT count(*) FROM node_tasks WHERE id = $1`, id).Scan(&known); err != nil {
				t.Fatal(err)
			}
			if known == 0 {
				unknown++
			}
		}
		b, err := os.ReadFile(filepath.Join(h.dir, "hostd.log"))
		if err != nil {
			t.Fatal(err)
		}
		dropped += len(rejected.FindAll(b, -1))
		replays += len(replayed.FindAll(b, -1))
	}
	// What the hosts held is not lost with the database: no task ran out of attempts on
	// the hosts' replay refusals (a provisioning would have failed, a release left its
	// slots cleanup_blocked without a wipe proof the database knew of).
	expired, err := c.A.Int(c.ctx, `SELECT count(*) FROM node_tasks WHERE status = 'expired'`)
	if err != nil {
		t.Fatal(err)
	}
	blocked, err := c.A.Int(c.ctx, `SELECT count(*) FROM node_resource_slots WHERE status = 'cleanup_blocked'`)
	if err != nil {
		t.Fatal(err)
	}
	if expired != 0 || blocked != 0 {
		t.Fatalf("%d tasks expired and %d slots cleanup_blocked after the failover: results the hosts held were lost", expired, blocked)
	}
	took := wakeup(t, c)
	t.Logf("failover (asynchronous standby, its stream cut %s before the kill): %d creates and %d releases acknowledged, %d of them while only the primary had them",
		r.kill.Sub(cutAt).Round(time.Millisecond), r.creates, r.release, ackedAfterCut)
	t.Logf("failover (asynchronous standby): LOST %d acknowledged creates (their owners now read not_found; hosts had run %d tasks the new primary never heard of and dropped %d results it rejected; those slots are on sale again) and %d acknowledged releases (%d of them active again, released again); redeliveries refused as replays (tasks whose result the database lost): %d; everything came to rest %s after the load, %d slots left cleanup_blocked",
		lostCreates, unknown, dropped, lostReleases, len(releasedAgain), replays, settled.Round(time.Second), blocked)
	t.Logf("failover (asynchronous standby): unavailable %s; /readyz 200 again %s (A) and %s (B) after the promotion; first create through B after the promotion taken by its host (polling A) %s after its create, %s after the promotion; later wake-up through B to an idle host parked on A in %s; failed calls: %s; raw reads answered 503: %d",
		r.unavailable().Round(time.Millisecond), r.readyBackA.Sub(r.promoted).Round(time.Millisecond),
		r.readyBackB.Sub(r.promoted).Round(time.Millisecond), r.wakeAfterCreate.Round(time.Millisecond), r.wakeAfterPromotion.Round(time.Millisecond),
		took.Round(time.Millisecond), sortedKinds(kinds), r.reads503)
}
