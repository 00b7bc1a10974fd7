package nodes

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// DrainOptions are `nodes drain` and `nodes undrain`'s dependencies and flags.
type DrainOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node   string
	Drain  bool // false: undrain
	Output output.Format
}

// NewCmdDrain is `nodes drain NODE`.
func NewCmdDrain(f *cmdutil.Factory, runF func(*DrainOptions) error) *cobra.Command {
	return newCmdDrain(f, runF, true, "drain NODE", "Stop new placements on a node (live allocations continue)")
}

// NewCmdUndrain is `nodes undrain NODE`.
func NewCmdUndrain(f *cmdutil.Factory, runF func(*DrainOptions) error) *cobra.Command {
	return newCmdDrain(f, runF, false, "undrain NODE", "Allow new placements on a node again")
}

func newCmdDrain(f *cmdutil.Factory, runF func(*DrainOptions) error, drain bool, use, short string) *cobra.Command {
	opts := &DrainOptions{IO: f.IO, Client: f.Client, Drain: drain}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if runF != nil {
				return runF(opts)
			}
			return drainRun(cmd.Context(), opts)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func drainRun(ctx context.Context, opts *DrainOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	var n *apiv1.Node
	if opts.Drain {
		n, err = c.DrainNode(ctx, opts.Node)
	} else {
		n, err = c.UndrainNode(ctx, opts.Node)
	}
	if err != nil {
		return err
	}
	return printList(opts.IO.Out, opts.Output, n, []apiv1.Node{*n})
}
