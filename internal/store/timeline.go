package store

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// After a failover the promoted standby writes on a new timeline (the old one plus one);
// the old primary, if it comes back as a server of its own (not fenced, not rejoined as a
// standby), still accepts writes on the old timeline. A multi-host URL with
// target_session_attrs=read-write would take it, being first in the list and read-write:
// two primaries, and this controller writing to the one the rest of the system left. So the
// highest timeline this process has seen for each cluster (its system identifier, which a
// primary and its standbys share) is remembered, and a read-write server behind it is
// skipped like a read-only one: pgconn moves on to the next host of the URL.
var timelines = struct {
	sync.Mutex
	highest map[string]uint64 // by system identifier
}{highest: map[string]uint64{}}

// guardTimeline wraps validate (target_session_attrs) with the timeline check.
func guardTimeline(validate pgconn.ValidateConnectFunc) pgconn.ValidateConnectFunc {
	return func(ctx context.Context, c *pgconn.PgConn) error {
		if err := validate(ctx, c); err != nil {
			return err
		}
		system, timeline, err := serverTimeline(ctx, c)
		if err != nil {
			return err
		}
		return admitTimeline(system, timeline)
	}
}

// serverTimeline reads a read-write server's system identifier and the timeline it writes
// WAL on (the first eight hex digits of the current WAL file's name; pg_control's
// checkpoint timeline lags a promotion until the next checkpoint).
func serverTimeline(ctx context.Context, c *pgconn.PgConn) (system string, timeline uint64, err error) {
	res, err := c.Exec(ctx, `SELECT system_identifier::text,
		CASE WHEN pg_is_in_recovery() THEN '' ELSE pg_walfile_name(pg_current_wal_lsn()) END FROM pg_control_system()`).ReadAll()
	if err != nil {
		return "", 0, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 2 {
		return "", 0, fmt.Errorf("store: unexpected answer reading the server's timeline")
	}
	row := res[0].Rows[0]
	if len(row[1]) == 0 {
		return string(row[0]), 0, nil // a standby (a read-only target_session_attrs chose it): it writes no WAL of its own
	}
	if len(row[1]) < 8 {
		return "", 0, fmt.Errorf("store: WAL file name %q: too short", row[1])
	}
	timeline, err = strconv.ParseUint(string(row[1][:8]), 16, 32)
	if err != nil {
		return "", 0, fmt.Errorf("store: WAL file name %q: %w", row[1], err)
	}
	return string(row[0]), timeline, nil
}

// admitTimeline records timeline for system and refuses one behind the highest seen.
func admitTimeline(system string, timeline uint64) error {
	if timeline == 0 {
		return nil
	}
	timelines.Lock()
	defer timelines.Unlock()
	if seen := timelines.highest[system]; timeline < seen {
		return &staleTimelineError{timeline: timeline, seen: seen}
	}
	timelines.highest[system] = timeline
	return nil
}

// staleTimelineError is a read-write server on an older timeline than this controller has
// written to: a former primary.
type staleTimelineError struct{ timeline, seen uint64 }

func (e *staleTimelineError) Error() string {
	return fmt.Sprintf("server writes on timeline %d, behind timeline %d this controller has used: a former primary after a failover (fence it or rejoin it as a standby); not writing to it", e.timeline, e.seen)
}
