package benchenv

import (
	"math"
	"strings"
	"testing"
)

// A log_statement_stats excerpt as PostgreSQL 15 writes it: a two-line statement's bind and
// execute, a one-line simple query, and an entry of another kind between them.
const statsLog = `2026-11-25 08:26:58.490 UTC [12317] LOG:  BIND MESSAGE STATISTICS
2026-11-25 08:26:58.490 UTC [12317] DETAIL:  ! system usage stats:
	!	0.000010 s user, 0.000056 s system, 0.000070 s elapsed
	!	[0.000000 s user, 0.001781 s system total]
	!	0/0 [2/0] voluntary/involuntary context switches
2026-11-25 08:26:58.490 UTC [12317] STATEMENT:  SELECT 1
	  + 1;
2026-11-25 08:26:58.490 UTC [12317] LOG:  EXECUTE MESSAGE STATISTICS
2026-11-25 08:26:58.490 UTC [12317] DETAIL:  ! system usage stats:
	!	0.000100 s user, 0.000008 s system, 0.000120 s elapsed
	!	[0.000000 s user, 0.001803 s system total]
2026-11-25 08:26:58.490 UTC [12317] STATEMENT:  SELECT 1
	  + 1;
2026-11-25 08:26:58.491 UTC [12318] LOG:  checkpoint starting: time
2026-11-25 08:26:58.492 UTC [12319] LOG:  QUERY STATISTICS
2026-11-25 08:26:58.492 UTC [12319] DETAIL:  ! system usage stats:
	!	0.001000 s user, 0.000500 s system, 0.002000 s elapsed
2026-11-25 08:26:58.492 UTC [12319] STATEMENT:  WITH d AS (DELETE FROM node_capacity_dirty RETURNING node_id) SELECT 1
`

func TestParseStatementCPU(t *testing.T) {
	got, total, err := ParseStatementCPU(strings.NewReader(statsLog))
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if len(got) != 2 || !near(total, 1.674) {
		t.Fatalf("got %+v, total %v ms; want 2 statements, 1.674 ms", got, total)
	}
	if got[0].Query != "WITH d AS (DELETE FROM node_capacity_dirty RETURNING node_id) SELECT 1" || got[0].Executes != 1 || !near(got[0].CPUms, 1.5) {
		t.Errorf("first: %+v", got[0])
	}
	// Bind and execute of one statement sum; only the execute counts as a run of it.
	if got[1].Query != "SELECT 1 + 1;" || got[1].Executes != 1 || !near(got[1].CPUms, 0.174) {
		t.Errorf("second: %+v", got[1])
	}
}
