package nodes

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// AddOptions are `nodes add`'s dependencies and flags.
type AddOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Name         string
	Region       string
	SKU          string
	SliceSKU     string
	TenantID     string
	ProfileTags  []string
	HardwareTags []string
	Output       output.Format
}

// NewCmdAdd is `nodes add NAME --region R`.
func NewCmdAdd(f *cmdutil.Factory, runF func(*AddOptions) error) *cobra.Command {
	opts := &AddOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "add NAME --region REGION",
		Short: "Register a node; prints its one-time bootstrap token for gpuaas-hostd enroll",
		Example: `  gpuaasctl nodes add h200-01 --region lab --sku h200-sxm-baremetal-8g --slice-sku h200-sxm-slice \
    --profile-tag gpuaas-profile-slice-vm --hardware-tag gpu-nvidia-h200`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if opts.Region == "" {
				return cmdutil.FlagErrorf("--region is required")
			}
			if runF != nil {
				return runF(opts)
			}
			return addRun(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Region, "region", "", "region")
	fl.StringVar(&opts.SKU, "sku", "", "baremetal SKU the whole node is sold as")
	fl.StringVar(&opts.SliceSKU, "slice-sku", "", "slice SKU its approved slots sell")
	fl.StringVar(&opts.TenantID, "tenant", "", "dedicate the node to one tenant")
	fl.StringArrayVar(&opts.ProfileTags, "profile-tag", nil, "profile tag (repeatable), e.g. gpuaas-profile-slice-vm")
	fl.StringArrayVar(&opts.HardwareTags, "hardware-tag", nil, "hardware tag (repeatable), e.g. gpu-nvidia-h200")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func addRun(ctx context.Context, opts *AddOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	n, err := c.CreateNode(ctx, apiv1.NodeCreate{
		Name: opts.Name, Region: opts.Region, TenantID: opts.TenantID, SKU: opts.SKU, SliceSKU: opts.SliceSKU,
		ProfileTags: opts.ProfileTags, HardwareTags: opts.HardwareTags,
	})
	if err != nil {
		return err
	}
	if err := printList(opts.IO.Out, opts.Output, n, []apiv1.Node{*n}); err != nil {
		return err
	}
	if opts.Output == output.Table && n.BootstrapToken != "" {
		fmt.Fprintf(opts.IO.Out, "\nbootstrap token (one-time, expires %s):\n%s\n", output.Time(n.BootstrapTokenExpiresAt), n.BootstrapToken)
		fmt.Fprintln(opts.IO.ErrOut, "enroll the host with: gpuaas-hostd enroll --server URL --ca-file CA --token TOKEN --config /etc/gpuaas/hostd.yaml")
	}
	return nil
}
