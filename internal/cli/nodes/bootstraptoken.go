package nodes

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// BootstrapTokenOptions are `nodes bootstrap-token`'s dependencies and flags.
type BootstrapTokenOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node   string
	Output output.Format
}

// NewCmdBootstrapToken is `nodes bootstrap-token NODE`.
func NewCmdBootstrapToken(f *cmdutil.Factory, runF func(*BootstrapTokenOptions) error) *cobra.Command {
	opts := &BootstrapTokenOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "bootstrap-token NODE",
		Short: "Issue a new one-time enrollment token for a node's host daemon",
		Long: `Issue a new one-time enrollment token for a node's host daemon (when the one printed by
'nodes add' expired or was used). The table output is the bare token, for scripts.`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			bt, err := c.NewBootstrapToken(cmd.Context(), opts.Node)
			if err != nil {
				return err
			}
			if opts.Output == output.Table {
				fmt.Fprintln(opts.IO.Out, bt.Token)
				fmt.Fprintf(opts.IO.ErrOut, "one-time token for node %s, expires %s\n", bt.NodeID, output.Time(bt.ExpiresAt))
				return nil
			}
			return output.Print(opts.IO.Out, opts.Output, bt, nil)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
