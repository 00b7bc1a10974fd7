package rules

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// Migrations are expand-only: during a rolling upgrade the previous release's controllers
// keep serving on the schema the new release migrated (docs/upgrades.md), so a migration's
// forward section may add tables, columns with defaults, indexes, functions and triggers, but
// never drop or rename a table or column, change a column's type or make it NOT NULL. Such
// a contract step lands one release after the code stopped using what it removes, and is
// listed in contractSteps with that reasoning. The down section (below the marker) may do
// anything.
var destructive = []struct {
	re   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`(?i)\bDROP\s+TABLE\b`), "drops a table"},
	{regexp.MustCompile(`(?i)\bDROP\s+(COLUMN\b|(IF\s+EXISTS\s+)?[a-z_]+\s*(,|;|CASCADE|RESTRICT))`), "drops a column"},
	{regexp.MustCompile(`(?i)\bRENAME\b`), "renames a table, column or constraint"},
	{regexp.MustCompile(`(?i)\bALTER\s+COLUMN\s+\S+\s+(SET\s+DATA\s+)?TYPE\b`), "changes a column's type"},
	{regexp.MustCompile(`(?i)\bALTER\s+COLUMN\s+\S+\s+SET\s+NOT\s+NULL\b`), "makes an existing column NOT NULL"},
	{regexp.MustCompile(`(?i)\bTRUNCATE\b`), "empties a table"},
	{regexp.MustCompile(`(?i)\bDROP\s+(VIEW|SCHEMA|MATERIALIZED\s+VIEW)\b`), "drops a view or schema"},
}

// contractSteps are forward sections allowed to contract the schema, by file name, with why
// the previous release no longer needs what they remove. None so far.
var contractSteps = map[string]string{}

const migrationMarker = "---- create above / drop below ----"

var sqlComment = regexp.MustCompile(`--[^\n]*`)

// destructiveStatements lists what a migration's forward section does that an expand-only
// migration must not.
func destructiveStatements(sql string) []string {
	forward, _, _ := strings.Cut(sql, migrationMarker)
	forward = sqlComment.ReplaceAllString(forward, "")
	var out []string
	for _, d := range destructive {
		for _, m := range d.re.FindAllString(forward, -1) {
			out = append(out, d.what+" ("+strings.Join(strings.Fields(m), " ")+")")
		}
	}
	sort.Strings(out)
	return out
}

func TestMigrationsAreExpandOnly(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "store", "migrations", "*.sql"))
	if err != nil || len(files) < 17 {
		t.Fatalf("migrations: %v (%d files)", err, len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f) // a migration without the marker is all forward section
		if _, ok := contractSteps[name]; ok {
			continue
		}
		for _, s := range destructiveStatements(string(b)) {
			t.Errorf("%s %s above its down marker: migrations are expand-only; a contract step lands a release later and is listed in contractSteps", name, s)
		}
	}
}

// The checker itself catches each destructive kind and passes the expand statements the
// existing migrations use.
func TestDestructiveStatementsAreFound(t *testing.T) {
	bad := map[string]string{
		"ALTER TABLE nodes DROP COLUMN region;":                       "drops a column",
		"ALTER TABLE nodes DROP region;":                              "drops a column",
		"DROP TABLE tenants;":                                         "drops a table",
		"ALTER TABLE nodes RENAME COLUMN name TO hostname;":           "renames",
		"ALTER TABLE nodes RENAME TO hosts;":                          "renames",
		"ALTER TABLE nodes ALTER COLUMN region TYPE varchar(10);":     "changes a column's type",
		"ALTER TABLE nodes ALTER COLUMN sku SET NOT NULL;":            "NOT NULL",
		"TRUNCATE audit_log;":                                         "empties a table",
		"ALTER TABLE nodes ALTER COLUMN x SET DATA TYPE bigint;":      "changes a column's type",
		"alter table nodes drop column if exists region cascade;":     "drops a column",
		"CREATE TABLE x (a int);\nDROP TABLE IF EXISTS node_tasks;\n": "drops a table",
	}
	for sql, want := range bad {
		got := destructiveStatements(sql + "\n" + migrationMarker + "\n")
		if len(got) == 0 || !strings.Contains(strings.Join(got, ";"), want) {
			t.Errorf("%q: found %v, want %q", sql, got, want)
		}
	}
	good := []string{
		"ALTER TABLE node_tasks ADD COLUMN schema_version integer NOT NULL DEFAULT 1;",
		"ALTER TABLE node_tasks DROP CONSTRAINT node_tasks_status_check;",
		"DROP INDEX IF EXISTS node_resource_slots_available;",
		"DROP TRIGGER IF EXISTS t ON nodes;",
		"CREATE OR REPLACE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;",
		"-- we never DROP TABLE here\nCREATE INDEX i ON nodes (name);",
		"CREATE TABLE t (a int);\n" + migrationMarker + "\nDROP TABLE t;",
	}
	for _, sql := range good {
		if got := destructiveStatements(sql); len(got) > 0 {
			t.Errorf("%q: flagged %v", sql, got)
		}
	}
}
