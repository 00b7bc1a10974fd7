package rules

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryFuzzTargetRunsInMake: `make fuzz` (and `make test`) run the targets named in the
// Makefile's FUZZ_TARGETS, one go test -fuzz per target; a FuzzXxx missing from the list
// would never fuzz, and a stale entry would fail the build.
func TestEveryFuzzTargetRunsInMake(t *testing.T) {
	root := filepath.Join("..", "..")
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)FUZZ_TARGETS :=(.*?)\n[A-Z]`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile has no FUZZ_TARGETS")
	}
	listed := map[string]bool{}
	for _, f := range strings.Fields(strings.ReplaceAll(string(m[1]), "\\", " ")) {
		listed[f] = true
	}
	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	found := map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		for _, fm := range fuzzFunc.FindAllSubmatch(b, -1) {
			found[filepath.ToSlash(rel)+":"+string(fm[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("no fuzz targets found: the scan is broken")
	}
	for f := range found {
		if !listed[f] {
			t.Errorf("%s is not in the Makefile's FUZZ_TARGETS", f)
		}
	}
	for f := range listed {
		if !found[f] {
			t.Errorf("FUZZ_TARGETS lists %s, which does not exist", f)
		}
	}
}
