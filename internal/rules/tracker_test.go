package rules

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// trackerRef is a reference to the issue tracker (the word issue and a number): a reader of the
// code cannot follow it.
var trackerRef = regexp.MustCompile(`(?i)\bissues? ?#?[0-9]+`)

// TestCommentsNameBehaviourNotTickets: no Go comment, test files included, points into the
// issue tracker; comments say what the code does and why, in their own terms.
func TestCommentsNameBehaviourNotTickets(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, cg := range f.Comments {
			if m := trackerRef.FindString(cg.Text()); m != "" {
				rel, _ := filepath.Rel(root, p)
				t.Errorf("%s: a comment names the tracker (%q): say what the code does instead", rel, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
