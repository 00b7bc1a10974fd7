// Package alloc is `gpuaasctl alloc`: create, list, show, release, wait for and explain
// allocations (a tenant's lease on GPUs).
package alloc

import (
	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

// NewCmdAlloc is the `alloc` command group.
func NewCmdAlloc(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "alloc",
		Short:   "Create, inspect and release allocations",
		Aliases: []string{"allocation", "allocations"},
	}
	return cmdutil.Group(cmd,
		NewCmdCreate(f, nil),
		NewCmdList(f, nil),
		NewCmdShow(f, nil),
		NewCmdRelease(f, nil),
		NewCmdWait(f, nil),
		NewCmdExplain(f, nil),
	)
}
