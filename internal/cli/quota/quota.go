// Package quota is `gpuaasctl quota`: per-tenant limits on GPUs and live allocations per SKU
// and region, with their usage (tenants read theirs; admins set them).
package quota

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ListOptions are `quota`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Tenant string
	Output output.Format
}

// NewCmdQuota is `quota`: without a subcommand it lists the caller's quotas and usage.
func NewCmdQuota(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "quota",
		Short:   "Quotas and their usage (admins: set them)",
		Aliases: []string{"quotas"},
		Long: `Quotas limit a tenant's live GPUs and live allocations of a SKU, in one region or in every
region together. Without a subcommand: the quotas that apply to you, with what counts against
them now (admins: every tenant's, or --tenant's). Held capacity (reservations) counts as GPUs.`,
		Example: `  gpuaasctl quota
  gpuaasctl quota set acme --sku h200-sxm-slice --gpus 16 --allocations 8
  gpuaasctl quota set acme --sku h200-sxm-slice --region us-east --gpus 8`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			qs, err := c.ListQuotas(cmd.Context(), opts.Tenant)
			if err != nil {
				return err
			}
			return printQuotas(opts.IO.Out, opts.Output, output.List(qs), qs)
		},
	}
	cmd.Flags().StringVar(&opts.Tenant, "tenant", "", "tenant id or name (admins)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	cmd.AddCommand(NewCmdSet(f, nil), NewCmdDelete(f, nil))
	return cmd
}

func limit(max *int, used int) string {
	if max == nil {
		return fmt.Sprintf("%d / -", used)
	}
	return fmt.Sprintf("%d / %d", used, *max)
}

func printQuotas(w io.Writer, o output.Format, v any, qs []apiv1.Quota) error {
	return output.Print(w, o, v, func(t *output.TableWriter) {
		t.Header("quotas", len(qs), "TENANT", "SKU", "REGION", "GPUS USED/MAX", "ALLOCATIONS USED/MAX")
		for _, q := range qs {
			region := q.Region
			if region == "" {
				region = "*"
			}
			t.Row(q.Tenant, q.SKU, region, limit(q.MaxGPUs, q.UsedGPUs), limit(q.MaxAllocations, q.UsedAllocs))
		}
	})
}

// SetOptions are `quota set`'s dependencies and flags.
type SetOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Tenant      string
	SKU         string
	Region      string
	GPUs        int
	Allocations int
	Output      output.Format
}

// NewCmdSet is `quota set TENANT --sku SKU [--region R] --gpus N --allocations M`.
func NewCmdSet(f *cmdutil.Factory, runF func(*SetOptions) error) *cobra.Command {
	opts := &SetOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "set TENANT --sku SKU [--region REGION] [--gpus N] [--allocations M]",
		Short: "Set a tenant's quota for a SKU (admin); replaces the one for the same SKU and region",
		Long: `Set a tenant's quota for a SKU, in --region or (without it) in every region together.
--gpus limits live GPUs (allocations' and reservations'), --allocations live allocations; a
limit left out is no limit. A quota under the current usage refuses new creates until releases
bring the usage under it; nothing running is stopped.`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Tenant = args[0]
			if opts.SKU == "" {
				return cmdutil.FlagErrorf("--sku is required")
			}
			gpus, allocs := cmd.Flags().Changed("gpus"), cmd.Flags().Changed("allocations")
			if !gpus && !allocs {
				return cmdutil.FlagErrorf("give --gpus, --allocations or both")
			}
			if (gpus && opts.GPUs < 0) || (allocs && opts.Allocations < 0) {
				return cmdutil.FlagErrorf("limits cannot be negative")
			}
			if runF != nil {
				return runF(opts)
			}
			set := apiv1.QuotaSet{SKU: opts.SKU, Region: opts.Region}
			if gpus {
				set.MaxGPUs = &opts.GPUs
			}
			if allocs {
				set.MaxAllocations = &opts.Allocations
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			q, err := c.SetQuota(cmd.Context(), opts.Tenant, set)
			if err != nil {
				return err
			}
			return printQuotas(opts.IO.Out, opts.Output, q, []apiv1.Quota{*q})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.SKU, "sku", "", "SKU the quota limits")
	fl.StringVar(&opts.Region, "region", "", "region (default: every region together)")
	fl.IntVar(&opts.GPUs, "gpus", 0, "most live GPUs (left out: no limit)")
	fl.IntVar(&opts.Allocations, "allocations", 0, "most live allocations (left out: no limit)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// DeleteOptions are `quota delete`'s dependencies and flags.
type DeleteOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Tenant string
	SKU    string
	Region string
	Yes    bool
}

// NewCmdDelete is `quota delete TENANT --sku SKU [--region R] --yes`.
func NewCmdDelete(f *cmdutil.Factory, runF func(*DeleteOptions) error) *cobra.Command {
	opts := &DeleteOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "delete TENANT --sku SKU [--region REGION] [--yes]",
		Short: "Remove a tenant's quota for a SKU and region (admin): no limit from then on",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Tenant = args[0]
			if opts.SKU == "" {
				return cmdutil.FlagErrorf("--sku is required")
			}
			if err := cmdutil.Confirm(opts.IO, opts.Yes, "Removing "+opts.Tenant+"'s quota for "+opts.SKU+" lifts its limit"); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			if err := c.DeleteQuota(cmd.Context(), opts.Tenant, opts.SKU, opts.Region); err != nil {
				return err
			}
			fmt.Fprintf(opts.IO.Out, "Removed %s's quota for %s\n", opts.Tenant, opts.SKU)
			return nil
		},
	}
	cmd.Flags().StringVar(&opts.SKU, "sku", "", "SKU")
	cmd.Flags().StringVar(&opts.Region, "region", "", "region (default: the every-region quota)")
	cmd.Flags().BoolVarP(&opts.Yes, "yes", "y", false, "do not ask")
	return cmd
}
