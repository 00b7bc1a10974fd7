// Package rules holds tests that enforce repository rules: package docs, and which packages
// may import what (only store and pgserver speak to PostgreSQL; the pure scheduler does no I/O).
package rules

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func packages(t *testing.T) map[string][]string {
	t.Helper()
	root := filepath.Join("..", "..")
	pkgs := map[string][]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			pkgs[rel] = append(pkgs[rel], p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for dir, files := range packages(t) {
		documented := false
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if af.Doc != nil && strings.TrimSpace(af.Doc.Text()) != "" {
				documented = true
			}
		}
		if !documented {
			t.Errorf("package %s has no doc comment", dir)
		}
	}
}

func TestImportBoundaries(t *testing.T) {
	rules := []struct {
		importPrefix string
		allowed      func(dir string) bool
		why          string
	}{
		{"github.com/jackc/pgx", func(d string) bool {
			return d == "internal/store" || strings.HasPrefix(d, "internal/pgserver") || d == "internal/bench/benchenv"
		}, "only store (queries), pgserver (cluster bootstrap) and the benchmark harness's invariant checks talk to PostgreSQL"},
		{"os/exec", func(d string) bool {
			return strings.HasPrefix(d, "internal/pgserver") || d == "internal/demo" || d == "internal/hostfs" || strings.HasPrefix(d, "internal/bench/") ||
				d == "internal/labhost"
		}, "commands run only through their owning seam (hostfs.Runner on hosts; the demo, the benchmark harness and the lab host harness drive the binaries and QEMU)"},
	}
	for dir, files := range packages(t) {
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				for _, r := range rules {
					if strings.HasPrefix(path, r.importPrefix) && !r.allowed(filepath.ToSlash(dir)) {
						t.Errorf("%s imports %s: %s", f, path, r.why)
					}
				}
				if filepath.ToSlash(dir) == "internal/sched" && !schedImports[path] {
					t.Errorf("%s imports %s: sched must stay pure (no I/O)", f, path)
				}
			}
		}
	}
}

// schedImports is what the pure scheduler may import: computation only, no I/O.
var schedImports = map[string]bool{"fmt": true, "math": true, "slices": true, "sort": true, "strings": true}
