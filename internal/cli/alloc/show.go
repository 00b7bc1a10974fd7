package alloc

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ShowOptions are `alloc show`'s dependencies and flags.
type ShowOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID     string
	Output output.Format
	Watch  cmdutil.WatchFlags
}

// NewCmdShow is `alloc show ID`.
func NewCmdShow(f *cmdutil.Factory, runF func(*ShowOptions) error) *cobra.Command {
	opts := &ShowOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show an allocation: state, placement, profile, image, price, cost, host tasks and claims",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if runF != nil {
				return runF(opts)
			}
			return showRun(cmd.Context(), opts)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	cmdutil.AddWatchFlags(cmd, &opts.Watch)
	return cmd
}

func showRun(ctx context.Context, opts *ShowOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	if opts.ID, err = cmdutil.AllocationID(ctx, c, opts.ID); err != nil {
		return err
	}
	return opts.Watch.Render(ctx, opts.IO, func(w io.Writer) error {
		a, err := c.GetAllocation(ctx, opts.ID)
		if err != nil {
			return err
		}
		return output.Print(w, opts.Output, a, func(t *output.TableWriter) { printDetail(t, a) })
	})
}
