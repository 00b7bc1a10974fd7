package controller

import (
	"fmt"
	"runtime"
	"strconv"

	"github.com/gpuaas/gpuaas/internal/store"
)

// Go's idle processors spin looking for work for a while before they sleep, and every request
// wakes one: on a machine whose other cores run PostgreSQL's backends that spinning takes the
// CPU the database needs. Measured on the 2-core bench machine (docs/performance.md), one
// processor instead of two cut a 1-client create+release from 6.7 to 4.9 ms (the controller's
// CPU per pair 2.2 -> 1.4 ms, PostgreSQL's 4.1 -> 3.2 ms) and changed nothing at 16 or 64
// clients. So with the database on the same machine the controller leaves it half the CPUs.

// procsChoice is what --max-procs asked for: all, a count n, or (the zero value) auto.
type procsChoice struct {
	all bool
	n   int
}

func parseMaxProcs(s string) (procsChoice, error) {
	switch s {
	case "auto", "":
		return procsChoice{}, nil
	case "all":
		return procsChoice{all: true}, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 4096 {
		return procsChoice{}, fmt.Errorf("--max-procs %q: want auto, all or a count of CPUs 1..4096", s)
	}
	return procsChoice{n: n}, nil
}

// maxProcs is the GOMAXPROCS the controller runs with (0: leave the runtime's value) and why.
// goDefault is the runtime's own choice (the CPUs the process may use), envSet whether the
// GOMAXPROCS variable set it (the operator's explicit choice wins), dbLocal whether PostgreSQL
// runs on this machine.
func maxProcs(c procsChoice, goDefault int, envSet, dbLocal bool) (int, string) {
	switch {
	case envSet:
		return 0, "the GOMAXPROCS variable"
	case c.n > 0:
		return c.n, "--max-procs"
	case c.all:
		return 0, "--max-procs all: every CPU the process may use"
	case dbLocal:
		return max(1, goDefault/2), "auto: PostgreSQL runs on this machine, half of its CPUs are left to it"
	}
	return 0, "auto: PostgreSQL runs elsewhere, every CPU the process may use"
}

// applyMaxProcs sets the runtime's GOMAXPROCS as chosen and returns the value in force and why.
func applyMaxProcs(c procsChoice, databaseURL string, envSet bool) (int, string) {
	n, why := maxProcs(c, runtime.GOMAXPROCS(0), envSet, store.IsLocalDatabase(databaseURL))
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
	return runtime.GOMAXPROCS(0), why
}
