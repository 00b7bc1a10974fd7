package configcmd

import "path/filepath"

// absPath makes a path given on the command line absolute, so the saved context works from
// any directory.
func absPath(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
