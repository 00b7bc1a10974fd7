package benchenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// StatementCPU is one statement's CPU in a run, from PostgreSQL's log_statement_stats: the
// backend's user + system time for each protocol message that ran it (parse, bind: which for
// a SELECT includes the executor's start, execute), summed. Unlike pg_stat_statements'
// execution time it counts no waiting (locks, WAL flushes, a core busy elsewhere), and it
// includes binding (a generic plan's executor start-up) and parsing.
type StatementCPU struct {
	Query    string  `json:"query"`    // whitespace collapsed, cut at 160 characters
	Executes int     `json:"executes"` // execute (or simple query) messages
	CPUms    float64 `json:"cpu_ms"`
}

// MeasureStatementCPU runs fn with log_statement_stats on (every backend, reloaded) and
// returns the CPU of each statement run meanwhile, most first, and the total. Logging every
// statement's usage slows the run: only the shares and per-statement costs mean anything.
func (e *Env) MeasureStatementCPU(ctx context.Context, fn func() error) ([]StatementCPU, float64, error) {
	path := e.PG.LogPath()
	st, err := os.Stat(path)
	if err != nil {
		return nil, 0, err
	}
	set := func(sql, want string) error {
		if err := e.Exec(ctx, sql); err != nil {
			return err
		}
		if err := e.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			return err
		}
		// Backends apply a reload before reading their next message; an idle pool connection
		// applies it after its first statement, which is then not counted. Wait until this
		// pool's connections see it.
		for range 100 {
			var v string
			if err := e.DB.QueryRow(ctx, `SHOW log_statement_stats`).Scan(&v); err != nil {
				return err
			}
			if v == want {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return fmt.Errorf("log_statement_stats did not become %s after a reload", want)
	}
	if err := set(`ALTER SYSTEM SET log_statement_stats = on`, "on"); err != nil {
		return nil, 0, err
	}
	ferr := fn()
	if err := set(`ALTER SYSTEM RESET log_statement_stats`, "off"); err != nil {
		return nil, 0, err
	}
	if ferr != nil {
		return nil, 0, ferr
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	if _, err := f.Seek(st.Size(), io.SeekStart); err != nil {
		return nil, 0, err
	}
	out, total, err := ParseStatementCPU(f)
	return out, total, err
}

var usageRE = regexp.MustCompile(`([0-9.]+) s user, ([0-9.]+) s system, ([0-9.]+) s elapsed`)

// ParseStatementCPU sums a PostgreSQL log's "... STATISTICS" entries (log_statement_stats)
// by the statement each one names (its STATEMENT line and the lines continuing it), most CPU
// first, and their total in milliseconds. An entry without a statement counts under "".
func ParseStatementCPU(r io.Reader) ([]StatementCPU, float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	sums := map[string]*StatementCPU{}
	var (
		pending, execute, inStatement bool
		cpu, total                    float64
		stmt                          strings.Builder
	)
	flush := func() {
		if !pending {
			return
		}
		q := strings.Join(strings.Fields(stmt.String()), " ")
		if len(q) > 160 {
			q = q[:157] + "..."
		}
		s := sums[q]
		if s == nil {
			s = &StatementCPU{Query: q}
			sums[q] = s
		}
		s.CPUms += cpu
		if execute {
			s.Executes++
		}
		pending, inStatement = false, false
		stmt.Reset()
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "\t") {
			if inStatement {
				stmt.WriteString(" " + line)
				continue
			}
			if m := usageRE.FindStringSubmatch(line); m != nil {
				u, err1 := strconv.ParseFloat(m[1], 64)
				s, err2 := strconv.ParseFloat(m[2], 64)
				if err1 != nil || err2 != nil {
					return nil, 0, fmt.Errorf("log_statement_stats: unreadable usage %q", line)
				}
				cpu = (u + s) * 1000
				total += cpu
				pending = true
			}
			continue
		}
		if i := strings.Index(line, "STATEMENT:  "); i >= 0 && pending {
			stmt.WriteString(line[i+12:])
			inStatement = true
			continue
		}
		flush() // a new entry: the previous one is complete
		if i := strings.Index(line, "LOG:  "); i >= 0 && strings.HasSuffix(line, "STATISTICS") {
			msg := line[i+6:]
			execute = strings.HasPrefix(msg, "EXECUTE") || strings.HasPrefix(msg, "QUERY")
		}
	}
	flush()
	out := make([]StatementCPU, 0, len(sums))
	for _, s := range sums {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CPUms > out[j].CPUms })
	return out, total, sc.Err()
}
