package nodes

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// MaintenanceOptions are `nodes maintenance`'s dependencies and flags.
type MaintenanceOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)
	Output output.Format
}

// NewCmdMaintenance is `nodes maintenance`: the maintenance notices sent with
// `nodes drain --notice`, latest deadline first.
func NewCmdMaintenance(f *cmdutil.Factory, runF func(*MaintenanceOptions) error) *cobra.Command {
	opts := &MaintenanceOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "maintenance",
		Short: "List maintenance notices (tenants: those about their allocations, without the node)",
		Args:  cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			items, err := c.ListMaintenance(cmd.Context())
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, output.List(items), func(t *output.TableWriter) {
				t.Header("maintenance notices", len(items), "DEADLINE", "NODE", "ALLOCATIONS", "REASON", "ID")
				for _, n := range items {
					t.Row(output.Time(n.Deadline), output.Dash(n.NodeName), output.Dash(strings.Join(n.Allocations, ",")), n.Reason, n.ID)
				}
			})
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
