// Package tokens is `gpuaasctl tokens`: API tokens (admin).
package tokens

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// NewCmdTokens is the `tokens` command group.
func NewCmdTokens(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "tokens", Short: "API tokens (admin)", Aliases: []string{"token"}}
	return cmdutil.Group(cmd, NewCmdCreate(f, nil), NewCmdList(f, nil), NewCmdRevoke(f, nil))
}

// CreateOptions are `tokens create`'s dependencies and flags.
type CreateOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Name     string
	Role     string
	TenantID string
	TTL      time.Duration
	Output   output.Format
}

// NewCmdCreate is `tokens create --name N --role admin|tenant`.
func NewCmdCreate(f *cmdutil.Factory, runF func(*CreateOptions) error) *cobra.Command {
	opts := &CreateOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "create --name NAME --role admin|tenant [--tenant ID] [--ttl 720h]",
		Short: "Create an API token; it is shown once",
		Long: `Create an API token. The token is shown once: the controller keeps only its hash.
The table output is the bare token, for scripts; -o json prints the whole record.`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Name == "" {
				return cmdutil.FlagErrorf("--name is required")
			}
			if opts.Role != "admin" && opts.Role != "tenant" {
				return cmdutil.FlagErrorf("--role must be admin or tenant")
			}
			if opts.Role == "tenant" && opts.TenantID == "" {
				return cmdutil.FlagErrorf("--tenant is required for a tenant token")
			}
			if opts.Role == "admin" && opts.TenantID != "" {
				return cmdutil.FlagErrorf("--tenant is only for tenant tokens")
			}
			if opts.TTL < 0 {
				return cmdutil.FlagErrorf("--ttl must not be negative")
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			req := apiv1.TokenCreate{Name: opts.Name, Role: opts.Role, TenantID: opts.TenantID}
			if opts.TTL > 0 {
				req.TTL = opts.TTL.String()
			}
			tok, err := c.CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			if opts.Output != output.Table {
				return output.Print(opts.IO.Out, opts.Output, tok, nil)
			}
			fmt.Fprintln(opts.IO.Out, tok.Token)
			expires := "never"
			if tok.ExpiresAt != nil {
				expires = output.Time(*tok.ExpiresAt)
			}
			fmt.Fprintf(opts.IO.ErrOut, "token %s (%s, %s) created, expires %s; store it now: it is not shown again\n", tok.Name, tok.ID, tok.Role, expires)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Name, "name", "", "token name")
	fl.StringVar(&opts.Role, "role", "", "admin or tenant")
	fl.StringVar(&opts.TenantID, "tenant", "", "tenant id (tenant tokens)")
	fl.DurationVar(&opts.TTL, "ttl", 0, "lifetime, e.g. 720h (default: no expiry)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
