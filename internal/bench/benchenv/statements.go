package benchenv

import (
	"context"
	"strings"
)

// Statement is one normalized statement's share of a run, from pg_stat_statements.
type Statement struct {
	Query   string  `json:"query"`    // normalized, whitespace collapsed, cut at 160 characters
	Calls   int64   `json:"calls"`    //
	TotalMS float64 `json:"total_ms"` // execution time (wall: includes lock waits), not planning
	Rows    int64   `json:"rows"`     //
}

// ResetStatements empties pg_stat_statements (Options.Statements; creates the extension the
// first time).
func (e *Env) ResetStatements(ctx context.Context) error {
	if err := e.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}
	return e.Exec(ctx, `SELECT pg_stat_statements_reset()`)
}

// TopStatements returns the n statements that took the most execution time since the last
// ResetStatements, all databases and users (the controller's and pgbench's).
func (e *Env) TopStatements(ctx context.Context, n int) ([]Statement, error) {
	rows, err := e.DB.Query(ctx, `SELECT query, calls, total_exec_time, rows FROM pg_stat_statements
		WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Statement
	for rows.Next() {
		var s Statement
		if err := rows.Scan(&s.Query, &s.Calls, &s.TotalMS, &s.Rows); err != nil {
			return nil, err
		}
		s.Query = strings.Join(strings.Fields(s.Query), " ")
		if len(s.Query) > 160 {
			s.Query = s.Query[:157] + "..."
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
