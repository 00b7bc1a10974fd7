package tokens

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ListOptions are `tokens list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Output output.Format
}

// NewCmdList is `tokens list`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List API tokens (names, roles, use and revocation; never the secrets)",
		Aliases: []string{"ls"},
		Args:    cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			toks, err := c.ListTokens(cmd.Context())
			if err != nil {
				return err
			}
			return printTokens(opts, output.List(toks), toks)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func printTokens(opts *ListOptions, v any, toks []apiv1.Token) error {
	return output.Print(opts.IO.Out, opts.Output, v, func(t *output.TableWriter) {
		t.Header("tokens", len(toks), "ID", "NAME", "ROLE", "TENANT", "CREATED", "LAST USED", "EXPIRES", "REVOKED")
		for _, k := range toks {
			t.Row(k.ID, k.Name, k.Role, output.Dash(k.TenantID), output.TimePtr(k.CreatedAt), output.TimePtr(k.LastUsedAt),
				output.TimePtr(k.ExpiresAt), output.TimePtr(k.RevokedAt))
		}
	})
}

// RevokeOptions are `tokens revoke`'s dependencies and flags.
type RevokeOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID     string
	Yes    bool
	Output output.Format
}

// NewCmdRevoke is `tokens revoke ID`.
func NewCmdRevoke(f *cmdutil.Factory, runF func(*RevokeOptions) error) *cobra.Command {
	opts := &RevokeOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "revoke ID [--yes]",
		Short: "Revoke an API token (immediately refused; audited)",
		Long: `Revoke an API token by id (see 'tokens list'). The controller that handles the request
refuses the token at once; other replicas drop it through PostgreSQL NOTIFY, or at the
latest when their 5-second cache entry expires.`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if err := cmdutil.Confirm(opts.IO, opts.Yes, "Revoking token "+opts.ID+" refuses it everywhere at once"); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			if opts.ID, err = cmdutil.TokenID(cmd.Context(), c, opts.ID); err != nil {
				return err
			}
			tok, err := c.RevokeToken(cmd.Context(), opts.ID)
			if err != nil {
				return err
			}
			if opts.Output != output.Table {
				return output.Print(opts.IO.Out, opts.Output, tok, nil)
			}
			fmt.Fprintf(opts.IO.Out, "token %s (%s, %s) revoked at %s\n", tok.ID, tok.Name, tok.Role, output.TimePtr(tok.RevokedAt))
			return nil
		},
	}
	cmd.Flags().BoolVarP(&opts.Yes, "yes", "y", false, "do not ask")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
