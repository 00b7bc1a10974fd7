package agent

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// progress is the poll loop's promise of when it will next make progress. The loop renews it
// before each step with that step's bound (a long poll's timeout, a backoff, waiting for a
// free task slot); the systemd watchdog is fed only while the promise holds, so a loop stuck
// past its bound stops the pings and systemd restarts hostd.
type progress struct{ until atomic.Int64 } // unix nanoseconds

// expect promises progress within d from now.
func (p *progress) expect(d time.Duration) { p.until.Store(time.Now().Add(d).UnixNano()) }

// alive reports whether the latest promise still holds at now.
func (p *progress) alive(now time.Time) bool { return now.UnixNano() <= p.until.Load() }

// watchdog sends WATCHDOG=1 at half of WatchdogSec while the poll loop keeps its promise, and
// withholds it (logging once) while it does not.
func (a *Agent) watchdog(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	stuck := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !a.loop.alive(now) {
				if !stuck {
					a.log.Error("poll loop made no progress within its bound; withholding the systemd watchdog")
				}
				stuck = true
				continue
			}
			if stuck {
				a.log.Info("poll loop progressing again; feeding the systemd watchdog")
			}
			stuck = false
			_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		}
	}
}

// watchdogInterval is WatchdogSec as systemd passed it (0 when the watchdog is off).
func watchdogInterval() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0
	}
	return d
}
