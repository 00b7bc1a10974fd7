package slots

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/tasks"
	"github.com/gpuaas/gpuaas/internal/client"
)

// WipeOptions are `slots wipe`'s dependencies and flags.
type WipeOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node    string
	Index   int
	Apply   bool
	Wait    bool
	Timeout time.Duration
}

// NewCmdWipe is `slots wipe NODE INDEX`.
func NewCmdWipe(f *cmdutil.Factory, runF func(*WipeOptions) error) *cobra.Command {
	opts := &WipeOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "wipe NODE INDEX [--apply] [--wait]",
		Short: "Repair a cleanup_blocked slot: wipe its disk and verify (a plan unless --apply)",
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
			id, err := c.WipeSlot(cmd.Context(), opts.Node, opts.Index, opts.Apply)
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
	cmd.Flags().BoolVar(&opts.Apply, "apply", false, "perform the wipe")
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait for the host's evidence")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 2*time.Hour, "with --wait: give up after this long")
	return cmd
}
