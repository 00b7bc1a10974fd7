// Package skus is `gpuaasctl skus`: the product catalog (list; create and the demand mix for
// admins).
package skus

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// NewCmdSKUs is the `skus` command group.
func NewCmdSKUs(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "skus", Short: "The product catalog", Aliases: []string{"sku"}}
	return cmdutil.Group(cmd, NewCmdList(f, nil), NewCmdShow(f), NewCmdCreate(f, nil), NewCmdSet(f), NewCmdValidation(f), NewCmdMix(f, nil))
}

func printSKUs(t *output.TableWriter, skus []apiv1.SKU) {
	t.Header("SKUs", len(skus), "SKU", "SHAPE", "MODEL", "FABRIC", "GPU COUNTS", "PRICE/GPU-HOUR", "ACTIVE")
	for _, s := range skus {
		t.Row(s.SKU, s.CapacityShape, output.Dash(s.AcceleratorModel), output.Dash(s.NetworkFabric),
			output.Ints(s.AllowedGPUCounts), output.Money(s.GPUHourlyPriceMinor, s.Currency), s.Active)
	}
}

// ListOptions are `skus list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	All    bool
	Output output.Format
}

// NewCmdList is `skus list`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List the active SKUs (--all: every SKU, admin)",
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
			var skus []apiv1.SKU
			if opts.All {
				skus, err = c.AdminListSKUs(cmd.Context())
			} else {
				skus, err = c.ListSKUs(cmd.Context())
			}
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, output.List(skus), func(t *output.TableWriter) { printSKUs(t, skus) })
		},
	}
	cmd.Flags().BoolVar(&opts.All, "all", false, "include inactive SKUs (admin)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// CreateOptions are `skus create`'s dependencies and flags.
type CreateOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	File   string
	Output output.Format
}

// NewCmdCreate is `skus create -f FILE`.
func NewCmdCreate(f *cmdutil.Factory, runF func(*CreateOptions) error) *cobra.Command {
	opts := &CreateOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "create -f FILE",
		Short: "Add a SKU from a YAML or JSON description with the API's field names (admin)",
		Args:  cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.File == "" {
				return cmdutil.FlagErrorf("-f FILE is required")
			}
			if runF != nil {
				return runF(opts)
			}
			var in apiv1.SKU
			if err := cmdutil.DecodeFile(opts.IO.In, opts.File, &in); err != nil {
				return err
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			s, err := c.CreateSKU(cmd.Context(), in)
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, s, func(t *output.TableWriter) { printSKUs(t, []apiv1.SKU{*s}) })
		},
	}
	cmd.Flags().StringVarP(&opts.File, "file", "f", "", "SKU description, YAML or JSON (- for standard input)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// NewCmdShow is `skus show SKU`.
func NewCmdShow(f *cmdutil.Factory) *cobra.Command {
	format := output.Table
	cmd := &cobra.Command{
		Use:   "show SKU",
		Short: "Show a SKU: shape, GPU counts, price, fabric and its slice VM profiles",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.Client()
			if err != nil {
				return err
			}
			skus, err := c.ListSKUs(cmd.Context())
			if err != nil {
				return err
			}
			for _, s := range skus {
				if s.SKU != args[0] {
					continue
				}
				return output.Print(f.IO.Out, format, s, func(t *output.TableWriter) {
					t.Row("SKU:", s.SKU)
					t.Row("Name:", output.Dash(s.DisplayName))
					t.Row("Shape:", s.CapacityShape)
					t.Row("Model:", output.Dash(s.AcceleratorModel))
					t.Row("GPU counts:", output.Ints(s.AllowedGPUCounts))
					t.Row("Price:", output.Money(s.GPUHourlyPriceMinor, s.Currency)+" per GPU-hour")
					t.Row("Fabric:", output.Dash(s.NetworkFabric))
					t.Row("Active:", s.Active)
					if s.CapacityShape == "gpu_slice" {
						t.Row("Validation:", output.Dash(s.ValidationPolicy))
					}
					if len(s.ResourceProfile) > 0 && string(s.ResourceProfile) != "{}" {
						t.Row("Profile:", string(s.ResourceProfile))
					}
				})
			}
			return &apiv1.Error{Code: apiv1.CodeNotFound, Message: fmt.Sprintf("no SKU %q (see gpuaasctl skus list)", args[0])}
		},
	}
	cmdutil.AddOutputFlag(cmd, &format)
	return cmd
}
