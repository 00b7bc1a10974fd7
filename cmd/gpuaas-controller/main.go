// Command gpuaas-controller is the gpuaas control plane daemon.
package main

import (
	"os"

	"github.com/gpuaas/gpuaas/internal/buildinfo"
	"github.com/gpuaas/gpuaas/internal/controller"
)

func main() {
	os.Exit(controller.Main(buildinfo.String(), os.Args[1:], os.Stdout, os.Stderr))
}
