package alloc

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ExplainOptions are `alloc explain`'s dependencies and flags.
type ExplainOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	SKU         string
	GPUs        int
	Region      string
	TenantID    string
	Reservation string
	Output      output.Format
}

// NewCmdExplain is `alloc explain`.
func NewCmdExplain(f *cmdutil.Factory, runF func(*ExplainOptions) error) *cobra.Command {
	opts := &ExplainOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "explain --sku SKU --gpus N",
		Short: "Placement dry run: where a request would land, or why it cannot (reserves nothing)",
		Long: `Placement dry run: where a request would land, or why it cannot. Nothing is reserved.
An infeasible request is a normal answer (Feasible: false, with the reason), exit status 0.`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Region == "" && opts.Reservation == "" {
				opts.Region = f.DefaultRegion()
			}
			if opts.SKU == "" && opts.Reservation == "" {
				return cmdutil.FlagErrorf("--sku is required (or --reservation)")
			}
			if opts.GPUs <= 0 {
				return cmdutil.FlagErrorf("--gpus must be a positive number")
			}
			if runF != nil {
				return runF(opts)
			}
			return explainRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.SKU, "sku", "", "SKU")
	cmd.Flags().IntVar(&opts.GPUs, "gpus", 0, "number of GPUs")
	cmd.Flags().StringVar(&opts.Region, "region", "", "region (default: the context's region, else any)")
	cmd.Flags().StringVar(&opts.TenantID, "tenant", "", "tenant id (admins: place as that tenant would be, its dedicated nodes included)")
	cmd.Flags().StringVar(&opts.Reservation, "reservation", "", "capacity reservation id: explain a placement inside it")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func explainRun(ctx context.Context, opts *ExplainOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	ex, err := c.ExplainPlacement(ctx, apiv1.PlacementRequest{SKU: opts.SKU, GPUs: opts.GPUs, Region: opts.Region,
		TenantID: opts.TenantID, ReservationID: opts.Reservation})
	if err != nil {
		return err
	}
	return output.Print(opts.IO.Out, opts.Output, ex, func(t *output.TableWriter) { printExplain(t, ex) })
}
