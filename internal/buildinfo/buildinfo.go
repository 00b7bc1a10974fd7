// Package buildinfo carries the version stamped into binaries by the Makefile (-ldflags -X).
package buildinfo

import "runtime/debug"

// Set by -ldflags "-X github.com/gpuaas/gpuaas/internal/buildinfo.Version=... -X ...Commit=...".
var (
	Version = "dev"
	Commit  = ""
)

// String is "VERSION (COMMIT)" with the VCS revision from the build info as a fallback.
func String() string {
	c := Commit
	if c == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					c = s.Value[:12]
				}
			}
		}
	}
	if c == "" {
		return Version
	}
	return Version + " (" + c + ")"
}
