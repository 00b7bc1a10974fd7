// Command gpuaasctl is the gpuaas operator and tenant CLI.
package main

import (
	"os"

	"github.com/gpuaas/gpuaas/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
