package slots

import (
	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ApproveOptions are `slots approve`'s dependencies and flags.
type ApproveOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node        string
	AllReady    bool
	SlotIndexes []int
	DryRun      bool
	Yes         bool
	Output      output.Format
}

// NewCmdApprove is `slots approve NODE`.
func NewCmdApprove(f *cmdutil.Factory, runF func(*ApproveOptions) error) *cobra.Command {
	opts := &ApproveOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "approve NODE (--all-ready | --slot N ...) (--dry-run | --yes)",
		Short: "Promote discovered candidates (see `topology show`) into approved, schedulable slots",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if !opts.AllReady && len(opts.SlotIndexes) == 0 {
				return cmdutil.FlagErrorf("--all-ready or --slot is required")
			}
			if !opts.Yes && !opts.DryRun {
				return cmdutil.FlagErrorf("approving slots makes their disks tenant storage (wiped on every release): confirm with --yes, or use --dry-run")
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			res, err := c.ApproveSlots(cmd.Context(), opts.Node, apiv1.SlotApprove{
				SlotIndexes: opts.SlotIndexes, AllReady: opts.AllReady, DryRun: opts.DryRun,
			})
			if err != nil {
				return err
			}
			return printChanges(opts.IO.Out, opts.Output, res, "approved")
		},
	}
	cmd.Flags().BoolVar(&opts.AllReady, "all-ready", false, "approve every ready candidate")
	cmd.Flags().IntSliceVar(&opts.SlotIndexes, "slot", nil, "approve these candidate slot indexes")
	cmd.Flags().BoolVar(&opts.DryRun, "dry-run", false, "show the resulting slot-map diff only")
	cmd.Flags().BoolVar(&opts.Yes, "yes", false, "confirm")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
