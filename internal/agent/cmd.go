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

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/topology"
)

// Main runs the gpuaas-hostd command line and returns the exit code.
func Main(version string, args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "gpuaas-hostd",
		Short:         "gpuaas host daemon: enrolls, long-polls the controller for signed tasks, runs them",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	root.AddCommand(newEnrollCmd(stdout), newRunCmd(version, stderr), newDiscoverCmd(stdout), &cobra.Command{
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
	fl.StringVar(&o.Server, "server", "", "controller URL (https://host:port)")
	fl.StringVar(&o.CAFile, "ca-file", "", "controller CA certificate")
	fl.StringVar(&o.Token, "token", "", "one-time bootstrap token (or GPUAAS_BOOTSTRAP_TOKEN)")
	fl.StringVar(&o.ConfigPath, "config", "/etc/gpuaas/hostd.yaml", "config file to write")
	fl.StringVar(&o.Runtime, "runtime", "", "slice runtime to record in the config (sim, lab, libvirt)")
	fl.StringVar(&o.HostRoot, "host-root", "", "host root to record in the config")
	fl.StringVar(&o.StateDir, "state-dir", "", "state directory to record in the config")
	return cmd
}

func newRunCmd(version string, stderr io.Writer) *cobra.Command {
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
	cmd := &cobra.Command{
		Use:   "discover [--host-root DIR] [-o json|table]",
		Short: "Discover GPUs, NVMe, fabric and candidate slot bundles locally (no controller needed)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			r, err := topology.Discover(hostfs.New(root))
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
	return cmd
}
