// Package tenants is `gpuaasctl tenants`: customer accounts (admin).
package tenants

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// NewCmdTenants is the `tenants` command group.
func NewCmdTenants(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "tenants", Short: "Customer accounts (admin)", Aliases: []string{"tenant"}}
	return cmdutil.Group(cmd, NewCmdCreate(f, nil), NewCmdList(f, nil))
}

func printTenants(w io.Writer, o output.Format, v any, ts []apiv1.Tenant) error {
	return output.Print(w, o, v, func(t *output.TableWriter) {
		t.Header("tenants", len(ts), "ID", "NAME", "CREATED")
		for _, tn := range ts {
			t.Row(tn.ID, tn.Name, output.Time(tn.CreatedAt))
		}
	})
}

// CreateOptions are `tenants create`'s dependencies and flags.
type CreateOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Name   string
	Output output.Format
}

// NewCmdCreate is `tenants create NAME`.
func NewCmdCreate(f *cmdutil.Factory, runF func(*CreateOptions) error) *cobra.Command {
	opts := &CreateOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tenant",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			tn, err := c.CreateTenant(cmd.Context(), opts.Name)
			if err != nil {
				return err
			}
			return printTenants(opts.IO.Out, opts.Output, tn, []apiv1.Tenant{*tn})
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// ListOptions are `tenants list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Output output.Format
}

// NewCmdList is `tenants list`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List tenants",
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
			ts, err := c.ListTenants(cmd.Context())
			if err != nil {
				return err
			}
			return printTenants(opts.IO.Out, opts.Output, output.List(ts), ts)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
