package slots

import (
	"github.com/spf13/cobra"
	"io"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ListOptions are `slots list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node   string
	Output output.Format
	Watch  cmdutil.WatchFlags
}

// NewCmdList is `slots list NODE`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "list NODE",
		Short:   "List a node's slots",
		Aliases: []string{"ls"},
		Args:    cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			return opts.Watch.Render(cmd.Context(), opts.IO, func(w io.Writer) error {
				slots, err := c.ListSlots(cmd.Context(), opts.Node)
				if err != nil {
					return err
				}
				return printSlots(w, opts.Output, output.List(slots), slots)
			})
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	cmdutil.AddWatchFlags(cmd, &opts.Watch)
	return cmd
}
