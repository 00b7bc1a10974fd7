// Package version is `gpuaasctl version`.
package version

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

// NewCmdVersion prints gpuaasctl's version. It needs no configuration or controller.
func NewCmdVersion(f *cmdutil.Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the gpuaasctl version",
		Args:  cmdutil.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(f.IO.Out, "gpuaasctl %s\n", f.AppVersion)
			return err
		},
	}
}
