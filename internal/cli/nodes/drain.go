package nodes

import (
	"context"
	"time"

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
	// Notice and Reason (drain only) send a maintenance notice: every tenant with an
	// allocation on the node gets a maintenance.scheduled event with the deadline now+Notice.
	Notice time.Duration
	Reason string
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
			if drain && (opts.Notice > 0) != (opts.Reason != "") {
				return cmdutil.FlagErrorf("--notice and --reason go together: how long until the maintenance, and why")
			}
			if opts.Notice < 0 {
				return cmdutil.FlagErrorf("--notice must be a positive duration such as 24h")
			}
			if runF != nil {
				return runF(opts)
			}
			return drainRun(cmd.Context(), opts)
		},
	}
	if drain {
		cmd.Long = `Stop new placements on a node; live allocations continue. With --notice and --reason,
every tenant with an allocation on the node also gets a maintenance notice (a
maintenance.scheduled event, and webhook deliveries) with the deadline and the reason, never
the node's identity; ` + "`gpuaasctl nodes maintenance`" + ` lists the notices.`
		cmd.Flags().DurationVar(&opts.Notice, "notice", 0, "announce maintenance this far ahead, e.g. 24h (with --reason)")
		cmd.Flags().StringVar(&opts.Reason, "reason", "", "what tenants are told (with --notice)")
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
	switch {
	case opts.Drain && opts.Notice > 0:
		n, err = c.DrainNodeWithNotice(ctx, opts.Node, opts.Notice, opts.Reason)
	case opts.Drain:
		n, err = c.DrainNode(ctx, opts.Node)
	default:
		n, err = c.UndrainNode(ctx, opts.Node)
	}
	if err != nil {
		return err
	}
	return printList(opts.IO.Out, opts.Output, n, []apiv1.Node{*n})
}
