package faults

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// failoverFlags: a task whose lease answer the failover took is redelivered after 30 s; a
// host's renewed poll that found nothing re-reads the tasks table after at most that long,
// so a wake-up within a few seconds can only have come through NOTIFY.
var failoverFlags = []string{"--task-lease", "30s"}

// The primary is lost under load (SIGKILL of every PostgreSQL process) and a synchronous
// streaming standby is promoted, as a failover manager would: nothing any client was told
// succeeded is lost. Two controller replicas follow the promoted standby through their
// multi-host URL (target_session_attrs=read-write) without a restart, say /readyz 503 while
// no server accepts writes and 200 after, and answer tenants with a retryable 503 in our
// words, never a 500 or database text, never past the request timeout. Hosts run every task
// once and deliver every result; NOTIFY wake-ups work on the new primary. The unavailability
// window and the wake-up time are printed (docs/database-failover.md quotes them).
func TestDBFailoverSynchronousStandby(t *testing.T) {
	c, pair := newFailoverCluster(t, true, failoverFlags...)
	var hosts []*host
	for i := 0; i < 6; i++ { // 48 GPUs: 16 clients hold one each, and as many are being wiped
		hosts = append(hosts, c.addHost([]string{c.A.Server}, "--poll-wait", "60s"))
	}
	pidA, pidB := c.A.PID(), c.B.PID()

	r := failoverUnderLoad(t, c, pair, nil)
	kinds := checkFailures(t, r.failures, nil)
	settleAll(t, c, hosts)
	if c.A.PID() != pidA || c.B.PID() != pidB {
		t.Fatal("a controller replica was restarted; both must follow the new primary by themselves")
	}
	if missing := checkLedger(t, c, r.acks, true); len(missing) > 0 {
		t.Fatalf("%d acknowledged creates lost", len(missing))
	}
	c.checkInvariants()
	started := checkHosts(t, c, hosts)
	if r.wakeAfterCreate > 10*time.Second {
		t.Fatalf("the first allocation created through B after the promotion reached its host (polling A) %s after its create; NOTIFY wake-ups did not resume", r.wakeAfterCreate)
	}
	took := wakeup(t, c)
	if took > 10*time.Second {
		t.Fatalf("a task created through B after the failover reached the host parked on A after %s; NOTIFY wake-ups did not resume", took)
	}
	for _, dir := range []string{c.dir, filepath.Join(c.dir, "b")} {
		if lines := internalErrors(t, dir); len(lines) > 0 {
			t.Fatalf("a controller answered %d internal errors during the failover (%s):\n%s", len(lines), dir, strings.Join(lines, "\n"))
		}
	}
	t.Logf("failover (synchronous standby): %d creates and %d releases acknowledged, every one on the new primary; %d host tasks each run once; calls that failed and were retried: %s; raw reads answered 503 unavailable with Retry-After: %d",
		r.creates, r.release, started, sortedKinds(kinds), r.reads503)
	t.Logf("failover (synchronous standby): unavailable %s (last success before the kill to first success after the promotion); promotion %s after the kill; /readyz 200 again %s (A) and %s (B) after the promotion",
		r.unavailable().Round(time.Millisecond), r.promoted.Sub(r.kill).Round(time.Millisecond),
		r.readyBackA.Sub(r.promoted).Round(time.Millisecond), r.readyBackB.Sub(r.promoted).Round(time.Millisecond))
	t.Logf("failover (synchronous standby): wake-ups recovered: the first allocation created through B after the promotion was taken by its host (polling A) %s after its create, %s after the promotion; later, one created through B reached an idle host parked on A in %s",
		r.wakeAfterCreate.Round(time.Millisecond), r.wakeAfterPromotion.Round(time.Millisecond), took.Round(time.Millisecond))
}
