package pgserver

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrNoBinaries is returned when initdb, pg_ctl and postgres cannot be found together.
var ErrNoBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found; install them with: apt-get install postgresql")

// serverBinaries must all sit in one directory for it to be usable.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// FindBinDir locates the PostgreSQL server binaries: the directory of pg_ctl on PATH first,
// then /usr/lib/postgresql/*/bin, highest version first.
func FindBinDir() (string, error) {
	return findBinDir(exec.LookPath, "/usr/lib/postgresql/*/bin")
}

func findBinDir(lookPath func(string) (string, error), pattern string) (string, error) {
	if p, err := lookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if dir := filepath.Dir(p); usable(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob(pattern)
	slices.SortFunc(dirs, func(a, b string) int { return slices.Compare(binVersion(b), binVersion(a)) })
	for _, d := range dirs {
		if usable(d) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

// binVersion parses the version directory of .../postgresql/<version>/bin ("15", "9.6").
func binVersion(binDir string) []int {
	var v []int
	for _, part := range strings.Split(filepath.Base(filepath.Dir(binDir)), ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}

func usable(dir string) bool {
	for _, b := range serverBinaries {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}
