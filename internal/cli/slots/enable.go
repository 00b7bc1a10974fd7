package slots

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// EnableOptions are `slots enable` and `slots disable`'s dependencies and flags.
type EnableOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node   string
	Index  int
	Enable bool // false: disable
	Output output.Format
}

// NewCmdDisable is `slots disable NODE INDEX`.
func NewCmdDisable(f *cmdutil.Factory, runF func(*EnableOptions) error) *cobra.Command {
	return newCmdEnable(f, runF, false, "disable NODE INDEX", "Take a slot out of service")
}

// NewCmdEnable is `slots enable NODE INDEX`.
func NewCmdEnable(f *cmdutil.Factory, runF func(*EnableOptions) error) *cobra.Command {
	return newCmdEnable(f, runF, true, "enable NODE INDEX", "Return a disabled slot to service")
}

func newCmdEnable(f *cmdutil.Factory, runF func(*EnableOptions) error, enable bool, use, short string) *cobra.Command {
	opts := &EnableOptions{IO: f.IO, Client: f.Client, Enable: enable}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
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
			return enableRun(cmd.Context(), opts)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func enableRun(ctx context.Context, opts *EnableOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	var s *apiv1.Slot
	if opts.Enable {
		s, err = c.EnableSlot(ctx, opts.Node, opts.Index)
	} else {
		s, err = c.DisableSlot(ctx, opts.Node, opts.Index)
	}
	if err != nil {
		return err
	}
	return printSlots(opts.IO.Out, opts.Output, s, []apiv1.Slot{*s})
}
