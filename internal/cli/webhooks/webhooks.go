// Package webhooks is `gpuaasctl webhooks`: register HTTPS endpoints that receive the
// caller's events, signed; list them with their delivery counts, see each delivery's
// attempts (dead letters included), delete them.
package webhooks

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// NewCmdWebhooks is the `webhooks` command group.
func NewCmdWebhooks(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "webhooks", Short: "Receive your events at an HTTPS endpoint, signed", Aliases: []string{"webhook"}}
	return cmdutil.Group(cmd,
		NewCmdCreate(f, nil),
		NewCmdList(f, nil),
		NewCmdDeliveries(f, nil),
		NewCmdDelete(f, nil),
	)
}

// CreateOptions are `webhooks create`'s dependencies and flags.
type CreateOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	URL    string
	Tenant string
	Output output.Format
}

// NewCmdCreate is `webhooks create URL`.
func NewCmdCreate(f *cmdutil.Factory, runF func(*CreateOptions) error) *cobra.Command {
	opts := &CreateOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "create URL [--tenant ID]",
		Short: "Register an https:// endpoint; prints its signing secret, once",
		Long: `Register an https:// endpoint that receives every event of yours as a signed POST
(see docs/tenants.md, "Events and webhooks", for the signature recipe). The secret is
printed now and never again: store it where your receiver reads it. Admins name the tenant.`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.URL = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			h, err := c.CreateWebhook(cmd.Context(), apiv1.WebhookCreate{URL: opts.URL, TenantID: opts.Tenant})
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, h, func(t *output.TableWriter) {
				t.Row("ID", h.ID)
				t.Row("URL", h.URL)
				t.Row("SECRET", h.Secret)
				t.Blank()
				t.Row("The secret is shown only now.")
			})
		},
	}
	cmd.Flags().StringVar(&opts.Tenant, "tenant", "", "the tenant (admins only)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// ListOptions are `webhooks list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)
	Output output.Format
}

// NewCmdList is `webhooks list`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List webhooks with their pending, delivered and dead deliveries",
		Args:  cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			items, err := c.ListWebhooks(cmd.Context())
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, output.List(items), func(t *output.TableWriter) {
				t.Header("webhooks", len(items), "ID", "URL", "PENDING", "DELIVERED", "DEAD", "CREATED")
				for _, h := range items {
					t.Row(h.ID, h.URL, h.Pending, h.Delivered, h.Dead, output.Time(h.CreatedAt))
				}
			})
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// DeliveriesOptions are `webhooks deliveries`' dependencies and flags.
type DeliveriesOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID     string
	Status string
	Output output.Format
}

// NewCmdDeliveries is `webhooks deliveries ID [--status dead]`.
func NewCmdDeliveries(f *cmdutil.Factory, runF func(*DeliveriesOptions) error) *cobra.Command {
	opts := &DeliveriesOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "deliveries ID [--status pending|delivered|dead]",
		Short: "A webhook's deliveries, newest first, with every attempt (dead letters: --status dead)",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			switch opts.Status {
			case "", "pending", "delivered", "dead":
			default:
				return cmdutil.FlagErrorf("--status must be pending, delivered or dead")
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			items, err := c.WebhookDeliveries(cmd.Context(), opts.ID, opts.Status)
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, output.List(items), func(t *output.TableWriter) {
				t.Header("deliveries", len(items), "ID", "EVENT", "STATUS", "ATTEMPTS", "NEXT", "LAST ERROR")
				for _, d := range items {
					t.Row(d.ID, d.EventType, d.Status, strconv.Itoa(d.Attempts), output.TimePtr(d.NextAttemptAt), output.Dash(d.LastError))
					for _, a := range d.History {
						code := "-"
						if a.StatusCode != 0 {
							code = strconv.Itoa(a.StatusCode)
						}
						t.Row("", fmt.Sprintf("  attempt %d", a.Attempt), output.Time(a.At), code, output.Millis(a.DurationMS), output.Dash(a.Error))
					}
				}
			})
		},
	}
	cmd.Flags().StringVar(&opts.Status, "status", "", "only deliveries in this state: pending, delivered or dead")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// DeleteOptions are `webhooks delete`'s dependencies and flags.
type DeleteOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID     string
	Yes    bool
	Output output.Format
}

// NewCmdDelete is `webhooks delete ID --yes`.
func NewCmdDelete(f *cmdutil.Factory, runF func(*DeleteOptions) error) *cobra.Command {
	opts := &DeleteOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "delete ID [--yes]",
		Short: "Delete a webhook: no more deliveries; pending ones end as dead",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if err := cmdutil.Confirm(opts.IO, opts.Yes, "Deleting webhook "+opts.ID+" stops its deliveries"); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			h, err := c.DeleteWebhook(cmd.Context(), opts.ID)
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, h, func(t *output.TableWriter) {
				t.Row("deleted webhook", h.ID, h.URL)
			})
		},
	}
	cmd.Flags().BoolVarP(&opts.Yes, "yes", "y", false, "do not ask")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
