// Command gpuaas-hostd is the per-host daemon. Its enrollment, long-poll loop and task
// executors arrive with the host-agent work; today it reports its version only.
package main

import (
	"fmt"
	"os"

	"github.com/gpuaas/gpuaas/internal/buildinfo"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Printf("gpuaas-hostd %s\n", buildinfo.String())
		return
	}
	fmt.Fprintln(os.Stderr, "usage: gpuaas-hostd version\n(the host daemon's enroll/run/discover commands are not built yet)")
	os.Exit(2)
}
