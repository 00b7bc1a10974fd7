// Package whoami is `gpuaasctl whoami`: who the configured token is, on which controller.
package whoami

import (
	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// Options are `whoami`'s dependencies and flags.
type Options struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Output output.Format
}

// NewCmdWhoami is `whoami`.
func NewCmdWhoami(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "whoami",
		Short: "Show the identity and role of the configured token",
		Args:  cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			w, err := c.Whoami(cmd.Context())
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, w, func(t *output.TableWriter) {
				t.Row("Name:", w.Name)
				t.Row("Role:", w.Role)
				t.Row("Tenant:", output.Dash(w.TenantID))
				t.Row("Token ID:", output.Dash(w.TokenID))
				t.Row("Server:", c.Server())
			})
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
