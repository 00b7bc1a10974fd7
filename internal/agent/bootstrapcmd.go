package agent

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/bootstrap"
	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// newBootstrapCmd is `gpuaas-hostd bootstrap [--apply]`: the deployed-host bootstrap
// (gpuaas-host-bootstrap.service runs it with --apply).
func newBootstrapCmd(stdout io.Writer) *cobra.Command {
	var o bootstrap.Options
	root, apply := "/", false
	cmd := &cobra.Command{
		Use:   "bootstrap [--apply] [--hugepages-gib N]",
		Short: "Plan (default) or apply the slice host bootstrap: packages, IOMMU kernel args, vfio, OVS bridge + NAT, NVIDIA services",
		Long: `Checks what a slice host needs and, with --apply, does only the steps whose check fails:
packages (qemu, libvirt, OVMF, OVS, cloud-image and RDMA tools), IOMMU kernel arguments (and 1 GiB
hugepages), vfio modules at boot, the OVS slice bridge with NAT, host NVIDIA services off, a
traversable /var/lib/libvirt, stale dnsmasq reservations removed. Idempotent; re-run after the
reboot it may ask for (it says reboot_required and leaves a marker hostd reports).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := bootstrap.Bootstrapper{FS: hostfs.New(root), Run: hostfs.Exec{}}
			var r bootstrap.Report
			var err error
			if apply {
				r, err = b.Apply(cmd.Context(), o)
			} else {
				r, err = b.Plan(cmd.Context(), o)
			}
			if perr := printJSON(stdout, r); perr != nil {
				return perr
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&apply, "apply", false, "apply the needed steps (default: plan only)")
	cmd.Flags().StringVar(&root, "host-root", "/", "root of the host tree")
	cmd.Flags().StringVar(&o.Profile, "profile", "slice-vm", "slice-vm or baremetal (nothing to do)")
	cmd.Flags().StringVar(&o.Bridge, "bridge", "ovsbr0", "slice bridge")
	cmd.Flags().StringVar(&o.BridgeCIDR, "bridge-address", "10.100.0.1/24", "the host's address on the slice bridge")
	cmd.Flags().IntVar(&o.HugepagesGiB, "hugepages-gib", 0, "1 GiB hugepages to reserve at boot (0: none)")
	cmd.Flags().StringVar(&o.OVSDatapath, "ovs-datapath", "", "netdev for a userspace OVS bridge (no kernel module); default: the kernel datapath")
	cmd.Flags().StringSliceVar(&o.Only, "only", nil, "only these steps, e.g. slice_bridge,vfio_modules")
	return cmd
}
