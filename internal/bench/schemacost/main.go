// Command schemacost attributes what the reservation costs our schema: it runs the raw
// reserve+release script (apibench's pgbench reference) on a scratch fleet, once as the
// schema stands and once with each trigger and secondary index of the tables a pair writes
// taken away in turn (restored after), beside the minimal-schema reference. For each run it
// prints measures that do not depend on the machine's load: WAL bytes, records and full-page
// images per pair, rows inserted and updated per pair by table with the share of updates that
// were HOT, and PostgreSQL's CPU per pair. Taking a guarantee away is only done here, in the
// scratch database, to measure its price.
//
//	go run ./internal/bench/schemacost -bin bin
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/apibench"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// tables are the tables a create+release pair writes.
var tables = []string{"node_resource_slots", "allocations", "allocation_snapshots", "allocation_terms", "allocation_resource_claims", "events", "outbox", "audit_log", "node_tasks", "node_capacity_dirty"}

func main() {
	bin := flag.String("bin", "bin", "directory holding gpuaas-controller")
	nodes := flag.Int("nodes", 500, "fleet size (nodes of 8 slots)")
	clients := flag.Int("clients", 4, "pgbench connections")
	seconds := flag.Int("seconds", 5, "length of a run")
	only := flag.String("only", "", "comma-separated triggers or indexes to take away (default: every one)")
	api := flag.Bool("api", false, "also measure the pair through the API")
	flag.StringVar(&kind, "kind", "pgbench", "what the runs without a trigger or index, and the candidates, measure: pgbench (the raw script) or api")
	flag.BoolVar(&waldump, "waldump", false, "break each run's WAL down by relation (pg_waldump)")
	flag.BoolVar(&walKinds, "walkinds", false, "with -waldump, break each relation's WAL down by record kind too")
	flag.StringVar(&apply, "apply", "", "a candidate (try:NAME) applied before every run: run two of these at once, with and without it, to compare under the same load")
	flag.BoolVar(&stmtCPU, "stmtcpu", false, "log each statement's CPU (log_statement_stats) and print the statements' CPU per pair")
	flag.Parse()
	if err := run(context.Background(), *bin, *nodes, *clients, time.Duration(*seconds)*time.Second, *only, *api); err != nil {
		fmt.Fprintln(os.Stderr, "schemacost:", err)
		os.Exit(1)
	}
}

// waldump: break each run's WAL down by relation.
var waldump bool

// apply is a candidate applied before every run.
var apply string

// stmtCPU: measure each statement's CPU (slows the runs: only shares and per-statement costs mean anything).
var stmtCPU bool

// kind is what the removal and candidate runs measure ("pgbench" or "api").
var kind string

// candidates are cheaper forms tried as a whole (named "try:NAME" in -only): the change and
// its undo.
var candidates = []removal{
	{name: "try:wal_compression",
		take:    `ALTER SYSTEM SET wal_compression = lz4; SELECT pg_reload_conf()`,
		restore: `ALTER SYSTEM RESET wal_compression; SELECT pg_reload_conf()`},
	{name: "try:wal_compression_pglz",
		take:    `ALTER SYSTEM SET wal_compression = pglz; SELECT pg_reload_conf()`,
		restore: `ALTER SYSTEM RESET wal_compression; SELECT pg_reload_conf()`},
	{name: "try:claims_toast",
		take:    `ALTER TABLE allocation_resource_claims SET (toast_tuple_target = 256); ALTER TABLE allocation_resource_claims ALTER COLUMN resource_snapshot SET COMPRESSION lz4`,
		restore: `ALTER TABLE allocation_resource_claims RESET (toast_tuple_target); ALTER TABLE allocation_resource_claims ALTER COLUMN resource_snapshot SET COMPRESSION DEFAULT`},
	{name: "try:allocations_toast",
		take:    `ALTER TABLE allocations SET (toast_tuple_target = 256); ALTER TABLE allocations ALTER COLUMN image_snapshot SET COMPRESSION lz4; ALTER TABLE allocations ALTER COLUMN resolved_profile SET COMPRESSION lz4`,
		restore: `ALTER TABLE allocations RESET (toast_tuple_target)`},
	{name: "try:no_parent_locks",
		take:    `ALTER TABLE allocations DROP CONSTRAINT allocations_tenant_id_fkey; ALTER TABLE allocations DROP CONSTRAINT allocations_sku_fkey`,
		restore: `ALTER TABLE allocations ADD CONSTRAINT allocations_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants(id) NOT VALID; ALTER TABLE allocations ADD CONSTRAINT allocations_sku_fkey FOREIGN KEY (sku) REFERENCES sku_catalog(sku) NOT VALID`},
	{name: "try:generic_plans",
		take:    `ALTER DATABASE postgres SET plan_cache_mode = force_generic_plan`,
		restore: `ALTER DATABASE postgres RESET plan_cache_mode`},
	{name: "try:no_claim_keys",
		take:    `ALTER TABLE allocation_resource_claims DROP CONSTRAINT allocation_resource_claims_allocation_id_fkey; ALTER TABLE allocation_resource_claims DROP CONSTRAINT allocation_resource_claims_node_id_fkey; ALTER TABLE allocation_resource_claims DROP CONSTRAINT allocation_resource_claims_slot_id_fkey`,
		restore: `ALTER TABLE allocation_resource_claims ADD CONSTRAINT allocation_resource_claims_allocation_id_fkey FOREIGN KEY (allocation_id) REFERENCES allocations(id) NOT VALID; ALTER TABLE allocation_resource_claims ADD CONSTRAINT allocation_resource_claims_node_id_fkey FOREIGN KEY (node_id) REFERENCES nodes(id) NOT VALID; ALTER TABLE allocation_resource_claims ADD CONSTRAINT allocation_resource_claims_slot_id_fkey FOREIGN KEY (slot_id) REFERENCES node_resource_slots(id) NOT VALID`},
	{name: "try:tasks_toast",
		take:    `ALTER TABLE node_tasks SET (toast_tuple_target = 256)`,
		restore: `ALTER TABLE node_tasks RESET (toast_tuple_target)`},
}

// removal is one trigger or index taken away for a run, and how to put it back.
type removal struct {
	name, take, restore string
}

func run(ctx context.Context, bin string, nodes, clients int, d time.Duration, only string, api bool) error {
	dir, err := os.MkdirTemp("", "schemacost-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: dir, BinDir: bin})
	if err != nil {
		return err
	}
	defer env.Stop()
	if _, err := env.AddNodes(ctx, nodes); err != nil {
		return err
	}
	if err := apibench.PrepareRaw(ctx, env); err != nil {
		return err
	}
	if err := apibench.PrepareMinimal(ctx, env, nodes); err != nil {
		return err
	}
	removals, err := removals(ctx, env)
	if err != nil {
		return err
	}
	removals = append(removals, candidates...)
	if apply != "" {
		found := false
		for _, c := range candidates {
			if c.name == apply {
				found = true
				if err := execEach(ctx, env, c.take); err != nil {
					return fmt.Errorf("apply %s: %w", apply, err)
				}
			}
		}
		if !found {
			return fmt.Errorf("no candidate %s", apply)
		}
	}
	want := map[string]bool{}
	for _, n := range strings.Split(only, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	measure := func(label, kind string) error {
		if err := env.Heartbeat(ctx); err != nil {
			return err
		}
		if err := apibench.Cleanup(ctx, env); err != nil {
			return err
		}
		if err := apibench.CleanupMinimal(ctx, env); err != nil {
			return err
		}
		before, err := snapshot(ctx, env)
		if err != nil {
			return err
		}
		var lsn0, lsn1 string
		if err := env.DB.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn0); err != nil {
			return err
		}
		var r apibench.Result
		runIt := func() (err error) {
			switch kind {
			case "minimal":
				r, err = apibench.Minimal(ctx, env, nodes, clients, d)
			case "api":
				r, err = apibench.API(ctx, env, nodes, clients, d)
			default:
				r, err = apibench.Pgbench(ctx, env, nodes, clients, d)
			}
			return err
		}
		var top []benchenv.StatementCPU
		if stmtCPU {
			top, _, err = env.MeasureStatementCPU(ctx, runIt)
		} else {
			err = runIt()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
		if n, err := apibench.DoubleBooked(ctx, env); err != nil || n != 0 {
			return fmt.Errorf("%s: double-booked %d (%v)", label, n, err)
		}
		after, err := snapshot(ctx, env)
		if err != nil {
			return err
		}
		if err := env.DB.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn1); err != nil {
			return err
		}
		report(label, r, before, after)
		for _, st := range top {
			if ms := st.CPUms / float64(r.Pairs); ms >= 0.005 {
				fmt.Printf("    %.3f ms/pair %5.2f runs/pair  %s\n", ms, float64(st.Executes)/float64(r.Pairs), st.Query)
			}
		}
		if waldump {
			shares, err := walByRelation(ctx, env, lsn0, lsn1)
			if err != nil {
				return err
			}
			var parts []string
			var all, fpi int64
			for _, sh := range shares {
				all, fpi = all+sh.bytes, fpi+sh.fpi
				if float64(sh.bytes-sh.fpi)/float64(r.Pairs) < 20 {
					continue
				}
				parts = append(parts, fmt.Sprintf("%s %.0f B (%.1f)", sh.name, float64(sh.bytes-sh.fpi)/float64(r.Pairs), float64(sh.records)/float64(r.Pairs)))
			}
			fmt.Printf("    WAL %.2f KiB per pair, of which full-page images %.2f KiB; the rest by relation, bytes (records) per pair: %s\n",
				float64(all)/1024/float64(r.Pairs), float64(fpi)/1024/float64(r.Pairs), strings.Join(parts, "; "))
		}
		return nil
	}
	if err := measure("minimal schema", "minimal"); err != nil {
		return err
	}
	if err := measure("our schema", "pgbench"); err != nil {
		return err
	}
	if api {
		if err := measure("our schema, API", "api"); err != nil {
			return err
		}
	}
	for _, rm := range removals {
		if len(want) > 0 && !want[rm.name] {
			continue
		}
		if err := execEach(ctx, env, rm.take); err != nil {
			return fmt.Errorf("take away %s: %w", rm.name, err)
		}
		label := "without " + rm.name
		if strings.HasPrefix(rm.name, "try:") {
			label = rm.name
		}
		err := measure(label+" ("+kind+")", kind)
		if rerr := execEach(ctx, env, rm.restore); rerr != nil {
			return fmt.Errorf("restore %s: %w", rm.name, rerr)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// execEach runs the statements of sql ("; "-separated) one by one: ALTER SYSTEM runs outside
// a transaction block.
func execEach(ctx context.Context, env *benchenv.Env, sql string) error {
	for _, st := range strings.Split(sql, "; ") {
		if err := env.Exec(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// removals lists the user triggers and the indexes other than primary keys and those behind
// a constraint on the tables a pair writes.
func removals(ctx context.Context, env *benchenv.Env) ([]removal, error) {
	var out []removal
	rows, err := env.DB.Query(ctx, `SELECT tgname, tgrelid::regclass::text FROM pg_trigger
		WHERE NOT tgisinternal AND tgrelid::regclass::text = ANY($1) ORDER BY 2, 1`, tables)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name, table string
		if err := rows.Scan(&name, &table); err != nil {
			return nil, err
		}
		out = append(out, removal{name: name,
			take:    fmt.Sprintf(`ALTER TABLE %s DISABLE TRIGGER %s`, table, name),
			restore: fmt.Sprintf(`ALTER TABLE %s ENABLE TRIGGER %s`, table, name)})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = env.DB.Query(ctx, `SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i
		WHERE NOT i.indisprimary AND i.indrelid::regclass::text = ANY($1)
		  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid) ORDER BY 1`, tables)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			return nil, err
		}
		out = append(out, removal{name: name, take: `DROP INDEX ` + name, restore: def})
	}
	return out, rows.Err()
}

// stats is what PostgreSQL counted so far: WAL, and rows written by table.
type stats struct {
	walBytes, walRecords, walFPI int64
	ins, upd, hot                map[string]int64
}

func snapshot(ctx context.Context, env *benchenv.Env) (stats, error) {
	s := stats{ins: map[string]int64{}, upd: map[string]int64{}, hot: map[string]int64{}}
	// Counters of backends that ended are flushed when they exit; a fresh snapshot reads them.
	if err := env.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return s, err
	}
	if err := env.DB.QueryRow(ctx, `SELECT wal_bytes::bigint, wal_records, wal_fpi FROM pg_stat_wal`).Scan(&s.walBytes, &s.walRecords, &s.walFPI); err != nil {
		return s, err
	}
	rows, err := env.DB.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = ANY($1)`, tables)
	if err != nil {
		return s, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var i, u, h int64
		if err := rows.Scan(&name, &i, &u, &h); err != nil {
			return s, err
		}
		s.ins[name], s.upd[name], s.hot[name] = i, u, h
	}
	return s, rows.Err()
}

func report(label string, r apibench.Result, a, b stats) {
	p := float64(r.Pairs)
	fmt.Printf("%-52s %6.1f pairs/s  WAL %5.2f KiB/pair (%4.1f records, %4.2f FPI)  postgres %.3f ms/pair\n",
		label, r.PairsPerSec, r.WALPerPairKiB, float64(b.walRecords-a.walRecords)/p,
		float64(b.walFPI-a.walFPI)/p, r.CPUPerPairMS["postgres"])
	if label == "minimal schema" {
		return // its tables are in another database
	}
	names := make([]string, 0, len(b.ins))
	for n := range b.ins {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		ins, upd, hot := b.ins[n]-a.ins[n], b.upd[n]-a.upd[n], b.hot[n]-a.hot[n]
		if ins == 0 && upd == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s ins %.1f upd %.1f (HOT %.0f%%)", n, float64(ins)/p, float64(upd)/p, 100*float64(hot)/float64(max(upd, 1))))
	}
	fmt.Printf("    %s\n", strings.Join(parts, "; "))
}
