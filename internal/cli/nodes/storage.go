package nodes

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/tasks"
	"github.com/gpuaas/gpuaas/internal/client"
)

// StorageTransitionOptions are `nodes storage-transition`'s dependencies and flags.
type StorageTransitionOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node    string
	Devices []string
	Apply   bool
	Confirm string
	Wait    bool
	Timeout time.Duration
}

// NewCmdStorageTransition is `nodes storage-transition NODE --devices DEV,...`.
func NewCmdStorageTransition(f *cmdutil.Factory, runF func(*StorageTransitionOptions) error) *cobra.Command {
	opts := &StorageTransitionOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "storage-transition NODE --devices DEV,... [--apply --confirm NODE] [--wait]",
		Short: "Hand a node's raw NVMe from host use to slice ownership (a plan unless --apply)",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if len(opts.Devices) == 0 {
				return cmdutil.FlagErrorf("--devices is required")
			}
			if opts.Apply && opts.Confirm != opts.Node {
				return cmdutil.FlagErrorf("--apply destroys data: confirm with --confirm %s", opts.Node)
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			id, err := c.StorageTransition(cmd.Context(), opts.Node, apiv1.StorageTransitionRequest{
				Devices: opts.Devices, Apply: opts.Apply, Confirm: opts.Confirm,
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(opts.IO.ErrOut, "queued task %s\n", id)
			if !opts.Wait {
				return nil
			}
			return tasks.Wait(cmd.Context(), opts.IO.Out, c, id, opts.Timeout)
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&opts.Devices, "devices", nil, "raw devices (/dev/disk/by-id/...)")
	fl.BoolVar(&opts.Apply, "apply", false, "perform it (default: plan only)")
	fl.StringVar(&opts.Confirm, "confirm", "", "the node name, required with --apply")
	fl.BoolVar(&opts.Wait, "wait", false, "wait for the host's report")
	fl.DurationVar(&opts.Timeout, "timeout", 2*time.Hour, "with --wait: give up after this long")
	return cmd
}
