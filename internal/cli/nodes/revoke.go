package nodes

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// RevokeOptions are `nodes revoke`'s dependencies and flags.
type RevokeOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node   string
	Yes    bool
	Output output.Format
}

// NewCmdRevoke is `nodes revoke NODE --yes`.
func NewCmdRevoke(f *cmdutil.Factory, runF func(*RevokeOptions) error) *cobra.Command {
	opts := &RevokeOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "revoke NODE [--yes]",
		Short: "Revoke a host's certificates and unused bootstrap tokens (a stolen or retired host)",
		Long: `Revoke every certificate and unused bootstrap token of a node: its gpuaas-hostd is refused
at once by the controller that handles the request (other replicas follow through PostgreSQL
NOTIFY, at the latest within their 2-minute cache) and must be enrolled again with a new
'nodes bootstrap-token'. Allocations on the node are not touched; drain it first to move
work away. The revocation is audited.`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if err := cmdutil.Confirm(opts.IO, opts.Yes, "Revoking "+opts.Node+" cuts its host off until it is enrolled again"); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			rev, err := c.RevokeNode(cmd.Context(), opts.Node)
			if err != nil {
				return err
			}
			if opts.Output != output.Table {
				return output.Print(opts.IO.Out, opts.Output, rev, nil)
			}
			fmt.Fprintf(opts.IO.Out, "node %s: %d certificate(s) and %d bootstrap token(s) revoked; enroll it again with 'gpuaasctl nodes bootstrap-token %s'\n",
				opts.Node, rev.RevokedCertificates, rev.RevokedBootstrapTokens, opts.Node)
			return nil
		},
	}
	cmd.Flags().BoolVar(&opts.Yes, "yes", false, "confirm")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
