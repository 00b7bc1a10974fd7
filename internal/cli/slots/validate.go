package slots

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/tasks"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ValidateOptions are `slots validate`'s dependencies and flags.
type ValidateOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node    string
	Index   int
	Wait    bool
	Timeout time.Duration
}

// NewCmdValidate is `slots validate NODE INDEX`.
func NewCmdValidate(f *cmdutil.Factory, runF func(*ValidateOptions) error) *cobra.Command {
	opts := &ValidateOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "validate NODE INDEX [--wait]",
		Short: "Run the quick validation on an idle slot (PCIe checks, device reset read back); its result is the slot's evidence",
		Args:  cmdutil.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			idx, err := parseIndex(args[1])
			if err != nil {
				return err
			}
			opts.Index = idx
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			id, err := c.ValidateSlot(cmd.Context(), opts.Node, opts.Index)
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
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait for the host's result")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 30*time.Minute, "with --wait: give up after this long")
	return cmd
}
