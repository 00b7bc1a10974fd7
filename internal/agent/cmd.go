package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/prereq"
	"github.com/gpuaas/gpuaas/internal/topology"
)

// Main runs the gpuaas-hostd command line and returns the exit code.
func Main(version string, args []string, stdout, stderr io.Writer) int {
	return MainWithKnobs(version, args, stdout, stderr, Knobs{})
}

// MainWithKnobs is Main for a test binary that sets testing knobs (see Knobs).
func MainWithKnobs(version string, args []string, stdout, stderr io.Writer, k Knobs) int {
	root := &cobra.Command{
		Use:           "gpuaas-hostd",
		Short:         "gpuaas host daemon: enrolls, long-polls the controller for signed tasks, runs them",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	root.AddCommand(newEnrollCmd(stdout), newRunCmd(version, stderr, k), newDiscoverCmd(stdout), newPrereqCmd(stdout), newStorageTransitionCmd(stdout), newWipeCmd(stdout), newDebugCmd(stdout), newFirmwareCmd(stdout), newBootstrapCmd(stdout), newUnitCmd(stdout), &cobra.Command{
		Use: "version", Short: "Print the version", Args: cobra.NoArgs,
		Run: func(*cobra.Command, []string) { fmt.Fprintf(stdout, "gpuaas-hostd %s\n", version) },
	})
	if err := root.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(stderr, "gpuaas-hostd: %v\n", err)
		return 1
	}
	return 0
}

func newEnrollCmd(stdout io.Writer) *cobra.Command {
	var o EnrollOptions
	cmd := &cobra.Command{
		Use:   "enroll --server URL --ca-file FILE --token TOKEN --config FILE",
		Short: "Exchange a one-time bootstrap token for this host's identity (mTLS certificate, pinned task key)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Token == "" {
				o.Token = os.Getenv("GPUAAS_BOOTSTRAP_TOKEN")
			}
			c, err := Enroll(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "enrolled as node %s; identity and config written to %s (0600)\n", c.NodeID, o.ConfigPath)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&o.Servers, "server", nil, "controller URL (https://host:port); repeat or comma-separate to record several replicas")
	fl.StringVar(&o.CAFile, "ca-file", "", "controller CA certificate")
	fl.StringVar(&o.Token, "token", "", "one-time bootstrap token (or GPUAAS_BOOTSTRAP_TOKEN)")
	fl.StringVar(&o.ConfigPath, "config", "/etc/gpuaas/hostd.yaml", "config file to write")
	fl.StringVar(&o.Runtime, "runtime", "", "slice runtime to record in the config (sim, lab, libvirt)")
	fl.BoolVar(&o.LabHost, "lab-host", false, "this host is the lab host VM (make lab-host): count its emulated stand-ins as GPUs and fabric; the controller records it as simulated, never sold as real capacity")
	fl.StringVar(&o.HostRoot, "host-root", "", "host root to record in the config")
	fl.StringVar(&o.StateDir, "state-dir", "", "state directory to record in the config")
	return cmd
}

func newRunCmd(version string, stderr io.Writer, k Knobs) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run --config FILE",
		Short: "Run the host daemon (systemd Type=notify)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := LoadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			a, err := New(cfg, log, version)
			if err != nil {
				return err
			}
			a.knobs = k
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return a.Run(ctx)
		},
	}
	BindRunFlags(cmd.Flags())
	return cmd
}

func newDiscoverCmd(stdout io.Writer) *cobra.Command {
	var root, output string
	var opt topology.Options
	cmd := &cobra.Command{
		Use:   "discover [--host-root DIR] [-o json|table]",
		Short: "Discover GPUs, NVMe, fabric and candidate slot bundles locally (no controller needed)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			r, err := topology.DiscoverWith(hostfs.New(root), opt)
			if err != nil {
				return err
			}
			switch output {
			case "json":
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			case "table":
				return topology.PrintTable(stdout, r)
			default:
				return fmt.Errorf("-o must be json or table")
			}
		},
	}
	cmd.Flags().StringVar(&root, "host-root", "/", "root of the host tree to read")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "json or table")
	cmd.Flags().BoolVar(&opt.LabStandIns, "lab-host", false, "count the lab host VM's emulated stand-ins as GPUs and fabric (make lab-host)")
	cmd.Flags().BoolVar(&opt.VFIORebind, "slice-runtime-vfio-bind", false, "a GPU on its native driver does not block its candidate (hostd rebinds it to vfio-pci)")
	return cmd
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newStorageTransitionCmd(stdout io.Writer) *cobra.Command {
	var o disk.TransitionOptions
	var root string
	cmd := &cobra.Command{
		Use:   "storage-transition --devices DEV,... [--apply --node NAME --confirm NAME]",
		Short: "Hand raw NVMe from host/share use to slice ownership (dry run unless --apply)",
		Long: `Plans, and with --apply performs, the seed-003 storage transition for the listed devices:
back up fstab and comment out their share entries, unmount their share mounts, wipe
signatures and partition tables, blkdiscard, verify, and write a manifest under
/var/log/gpuaas. The OS disk is always refused. --apply also needs --confirm with the
node name. Only after this may the node's slots record storage_ownership=slice.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := disk.Wiper{FS: hostfs.New(root), Run: hostfs.Exec{}}
			res, err := w.Transition(cmd.Context(), o)
			if perr := printJSON(stdout, res); perr != nil {
				return perr
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&o.Devices, "devices", nil, "approved raw devices (/dev/disk/by-id/... preferred)")
	fl.BoolVar(&o.Apply, "apply", false, "perform the destructive steps (default: plan only)")
	fl.StringVar(&o.NodeName, "node", "", "this node's name")
	fl.StringVar(&o.Confirm, "confirm", "", "repeat the node name to confirm --apply")
	fl.StringVar(&root, "host-root", "/", "host root")
	return cmd
}

func newWipeCmd(stdout io.Writer) *cobra.Command {
	var apply bool
	var root, policy, identity string
	cmd := &cobra.Command{
		Use:   "wipe-verify DEVICE [--apply] [--policy P] [--identity KIND:VALUE]",
		Short: "Wipe a slot disk and verify it reads back clean (dry run unless --apply)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := disk.Wiper{FS: hostfs.New(root), Run: hostfs.Exec{}}
			ev, err := w.WipeWith(cmd.Context(), disk.WipeOptions{Device: args[0], Apply: apply, Policy: policy, Identity: identity})
			if perr := printJSON(stdout, ev); perr != nil {
				return perr
			}
			if err == nil && apply && !ev.Verified {
				return fmt.Errorf("wipe not verified: %s", ev.Error)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&apply, "apply", false, "perform the wipe (default: report what would happen)")
	cmd.Flags().StringVar(&root, "host-root", "/", "host root")
	cmd.Flags().StringVar(&policy, "policy", "", "destructive_wipe_policy: blkdiscard_zero_verify (default), nvme_sanitize_verify, secure_erase_verify")
	cmd.Flags().StringVar(&identity, "identity", "", "the disk's recorded identity (serial:..., wwn:..., eui64:..., nguid:...): refuse another disk")
	return cmd
}

func newPrereqCmd(stdout io.Writer) *cobra.Command {
	var root string
	var o prereq.Options
	var strict bool
	cmd := &cobra.Command{
		Use:   "prereq [--host-root DIR] [--hugepages-gib N] [--strict]",
		Short: "Check slice prerequisites (kvm, IOMMU, vfio-pci, OVS bridge, libvirt, OVMF, qemu-img, hugepages, pending reboot)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			r := prereq.Run(hostfs.New(root), o)
			if err := printJSON(stdout, r); err != nil {
				return err
			}
			if strict && !r.Ready {
				return fmt.Errorf("prerequisites failing: %v", r.Failed)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&root, "host-root", "/", "host root")
	cmd.Flags().IntVar(&o.HugepagesGiB, "hugepages-gib", 0, "1 GiB hugepages that must be free")
	cmd.Flags().StringVar(&o.Bridge, "bridge", "ovsbr0", "OVS bridge slice VMs attach to")
	cmd.Flags().BoolVar(&strict, "strict", false, "exit non-zero when not ready")
	return cmd
}
