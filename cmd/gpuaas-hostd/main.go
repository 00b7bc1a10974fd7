// Command gpuaas-hostd is the per-host daemon: it enrolls, long-polls the controller for
// signed typed tasks, runs them and reports phase-timed results.
package main

import (
	"os"

	"github.com/gpuaas/gpuaas/internal/agent"
	"github.com/gpuaas/gpuaas/internal/buildinfo"
)

func main() {
	os.Exit(agent.Main(buildinfo.String(), os.Args[1:], os.Stdout, os.Stderr))
}
