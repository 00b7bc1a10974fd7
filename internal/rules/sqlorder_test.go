package rules

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestOrderByNamesTheColumnNotItsCast: in ORDER BY a bare name means the select list's output
// column of that name before a table's column, and a cast keeps the column's name: "SELECT
// xid::text ... ORDER BY xid" sorts the text, "10" before "9" (the event log once skipped
// events that way where transaction ids gained a digit). A query that casts a column in its
// select list without renaming it orders by the qualified column (e.xid), or gives the cast
// another name (AS xid_text). It checks each SQL string literal of the Go code on its own (a
// query assembled from several strings is checked piece by piece) and the migrations.
func TestOrderByNamesTheColumnNotItsCast(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.IsDir():
			return nil
		case strings.HasSuffix(p, ".go"):
			if filepath.Base(filepath.Dir(p)) == "rules" {
				return nil // this rule's own examples
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, p, nil, 0)
			if err != nil {
				return err
			}
			consts, err := packageStringConsts(filepath.Dir(p))
			if err != nil {
				return err
			}
			seen := map[string]bool{}
			report := func(pos token.Pos, q string) {
				for _, bad := range castOrderedByName(q) {
					at := fmt.Sprintf("%s:%d: ORDER BY %s", rel, fset.Position(pos).Line, bad)
					if !seen[at] {
						seen[at] = true
						t.Errorf("%s names the select list's cast of %s, which sorts the cast's value: order by the qualified column, or name the cast otherwise", at, bad)
					}
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BinaryExpr:
					// A query assembled with +: its string pieces and the package's string
					// constants, anything else left as a placeholder.
					if n.Op == token.ADD {
						report(n.Pos(), joinSQL(n, consts))
					}
				case *ast.BasicLit:
					if s, err := strconv.Unquote(n.Value); err == nil && n.Kind == token.STRING {
						report(n.Pos(), s)
					}
				}
				return true
			})
		case strings.HasSuffix(p, ".sql") && strings.Contains(filepath.ToSlash(rel), "/migrations/"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, stmt := range strings.Split(sqlComment.ReplaceAllString(string(b), ""), ";") {
				for _, bad := range castOrderedByName(stmt) {
					t.Errorf("%s: ORDER BY %s names the select list's cast of %s, which sorts the cast's value: order by the qualified column, or name the cast otherwise", rel, bad, bad)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestOrderByRuleCatchesACastOrderedByName(t *testing.T) {
	for q, want := range map[string]int{
		`SELECT xid::text, id FROM events WHERE true ORDER BY xid DESC, id DESC LIMIT 1`:        1,
		`SELECT e.xid::text, e.id FROM events e ORDER BY xid, id`:                               1,
		`SELECT e.xid::text, e.id FROM events e ORDER BY e.xid, e.id`:                           0,
		`SELECT e.xid::text AS xid_text, e.id FROM events e ORDER BY xid`:                       0,
		`SELECT array_agg(a::text ORDER BY a) FROM t`:                                           0,
		`SELECT coalesce(a::text, '') FROM t ORDER BY a`:                                        0,
		`SELECT (SELECT b::text FROM u ORDER BY b LIMIT 1) FROM t`:                              1,
		`WITH x AS (SELECT a FROM t) SELECT a::int FROM x WHERE a <> ')' ORDER BY a NULLS LAST`: 1,
	} {
		if got := castOrderedByName(q); len(got) != want {
			t.Errorf("%s: found %v, want %d", q, got, want)
		}
	}
}

var (
	selectList = regexp.MustCompile(`(?is)\bSELECT\b(.*?)\bFROM\b`)
	orderBy    = regexp.MustCompile(`(?is)\bORDER\s+BY\b(.*?)(\bLIMIT\b|\bOFFSET\b|\bFOR\b|\bFETCH\b|$)`)
	// castItem is a select list item that casts a (possibly qualified) column and keeps its
	// name; its output column is the column's name.
	castItem  = regexp.MustCompile(`(?is)^\s*(?:[a-z_][a-z0-9_]*\.)?([a-z_][a-z0-9_]*)\s*::[^:]*(::[^:]*)*$`)
	aliased   = regexp.MustCompile(`(?i)\bAS\b`)
	orderTerm = regexp.MustCompile(`(?is)^\s*([a-z_][a-z0-9_]*)\s*(ASC|DESC)?\s*(NULLS\s+(FIRST|LAST))?\s*$`)
)

// joinSQL is the text of a + chain of strings: literals and the package's string constants as
// they are, anything else as "?".
func joinSQL(e ast.Expr, consts map[string]string) string {
	switch e := e.(type) {
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return joinSQL(e.X, consts) + joinSQL(e.Y, consts)
		}
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
			return s
		}
	case *ast.Ident:
		if s, ok := consts[e.Name]; ok {
			return s
		}
	case *ast.ParenExpr:
		return joinSQL(e.X, consts)
	}
	return " ? "
}

// packageStringConsts are the string constants declared in the Go files of dir (test files
// included), each a literal or a + chain of them.
func packageStringConsts(dir string) (map[string]string, error) {
	if c, ok := constsByDir[dir]; ok {
		return c, nil
	}
	out := map[string]string{}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	for _, p := range files {
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				v := spec.(*ast.ValueSpec)
				for i, name := range v.Names {
					if i < len(v.Values) {
						if s := joinSQL(v.Values[i], nil); s != " ? " {
							out[name.Name] = s
						}
					}
				}
			}
		}
	}
	constsByDir[dir] = out
	return out, nil
}

var constsByDir = map[string]map[string]string{}

// castOrderedByName returns the names a query (or any query nested in it) orders by that its
// own select list casts without renaming.
func castOrderedByName(q string) []string {
	var bad []string
	for _, scope := range sqlScopes(q) {
		sel := selectList.FindStringSubmatch(scope)
		ord := orderBy.FindStringSubmatch(scope)
		if sel == nil || ord == nil {
			continue
		}
		casts := map[string]bool{}
		for _, item := range strings.Split(sel[1], ",") {
			if m := castItem.FindStringSubmatch(item); m != nil && !aliased.MatchString(item) {
				casts[strings.ToLower(m[1])] = true
			}
		}
		for _, term := range strings.Split(ord[1], ",") {
			if m := orderTerm.FindStringSubmatch(term); m != nil && casts[strings.ToLower(m[1])] {
				bad = append(bad, m[1])
			}
		}
	}
	return bad
}

// sqlScopes splits q into its parenthesized levels, each with what its inner parentheses hold
// left out (and string constants blanked), so that a subquery's or an aggregate's ORDER BY is
// read with its own select list.
func sqlScopes(q string) []string {
	var out []string
	var stack []*strings.Builder
	cur := &strings.Builder{}
	quoted := false
	for _, r := range q {
		switch {
		case quoted:
			quoted = r != '\''
			r = ' '
		case r == '\'':
			quoted = true
			r = ' '
		case r == '(':
			cur.WriteString("()")
			stack = append(stack, cur)
			cur = &strings.Builder{}
			continue
		case r == ')' && len(stack) > 0:
			out = append(out, cur.String())
			cur = stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			continue
		}
		cur.WriteRune(r)
	}
	out = append(out, cur.String())
	for _, s := range stack {
		out = append(out, s.String())
	}
	return out
}
