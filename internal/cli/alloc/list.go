package alloc

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ListOptions are `alloc list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Status string
	Output output.Format
	Watch  cmdutil.WatchFlags
}

// NewCmdList is `alloc list`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List allocations (tenants: their own; admins: all)",
		Aliases: []string{"ls"},
		Args:    cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			return listRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Status, "status", "", "only allocations in this status (requested, provisioning, active, releasing, released, failed)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	cmdutil.AddWatchFlags(cmd, &opts.Watch)
	return cmd
}

func listRun(ctx context.Context, opts *ListOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	return opts.Watch.Render(ctx, opts.IO, func(w io.Writer) error {
		items, err := c.ListAllocations(ctx, opts.Status)
		if err != nil {
			return err
		}
		if items == nil {
			items = []apiv1.Allocation{}
		}
		// A bare JSON array (stable interface), unlike most lists' {"items": [...]}.
		return printList(w, opts.Output, items, items)
	})
}
