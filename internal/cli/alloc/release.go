package alloc

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ReleaseOptions are `alloc release`'s dependencies and flags.
type ReleaseOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID      string
	Report  string
	Yes     bool
	Wait    bool
	Timeout time.Duration
	Output  output.Format
}

// NewCmdRelease is `alloc release ID`.
func NewCmdRelease(f *cmdutil.Factory, runF func(*ReleaseOptions) error) *cobra.Command {
	opts := &ReleaseOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "release ID [--report TEXT] [--yes]",
		Short: "Release an allocation (its VM is torn down and its disks wiped)",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if err := cmdutil.Confirm(opts.IO, opts.Yes, "Releasing "+opts.ID+" destroys its VM and wipes its disks"); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			return releaseRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVarP(&opts.Yes, "yes", "y", false, "do not ask: the VM and its disks' data are gone for good")
	cmd.Flags().StringVar(&opts.Report, "report", "", "report a problem (\"GPU 1 Xid 79 during training\"): the slots are held for operator review")
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait until released, showing the host's phases as they complete")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 30*time.Minute, "with --wait: give up after this long")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func releaseRun(ctx context.Context, opts *ReleaseOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	if opts.ID, err = cmdutil.AllocationID(ctx, c, opts.ID); err != nil {
		return err
	}
	var a *apiv1.Allocation
	if opts.Report != "" {
		a, err = c.ReleaseAllocationWithReport(ctx, opts.ID, opts.Report)
	} else {
		a, err = c.ReleaseAllocation(ctx, opts.ID)
	}
	if err != nil {
		return err
	}
	if opts.Wait {
		if a, err = waitFor(ctx, opts.IO.ErrOut, c, a, "released", opts.Timeout); err != nil {
			return err
		}
	}
	return printList(opts.IO.Out, opts.Output, a, []apiv1.Allocation{*a})
}
