package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// NewRootCmd builds the gpuaas-controller command tree.
func NewRootCmd(version string, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "gpuaas-controller",
		Short:         "gpuaas control plane: HTTPS API, scheduler and allocation lifecycle over PostgreSQL",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newServeCmd(version, stderr), newInitCmd(stdout), newMigrateCmd(stdout, stderr), newVersionCmd(version, stdout), newUnitCmd(stdout),
		newBackupCmd(version, stdout, stderr), newRestoreCmd(stdout, stderr))
	return root
}

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		lvl = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func newServeCmd(version string, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the controller (initializes the state directory and embedded database when needed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return Serve(ctx, cfg, version, newLogger(cfg, stderr))
		},
	}
	bindFlags(cmd.Flags(), "state-dir", "listen", "database-url", "hostname", "heartbeat-max-age", "log-level", "log-format", "max-db-conns", "task-lease", "provision-ttl", "reconcile-interval", "terminal-record-dir", "terminal-idle", "terminal-max-per-tenant", "replica-wakeups", "pprof-listen", "advertise-url", "gc-headroom-mib", "max-procs", "allow-simulated-hosts", "allow-untested-images", "webhook-ca-file", "webhook-allow-private", "image-keys", "event-retention", "config")
	return cmd
}

func newInitCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create the CA, server certificate, task-signing key and first admin token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			res, err := Init(cfg)
			if err != nil {
				return err
			}
			if len(res.Created) == 0 {
				fmt.Fprintf(stdout, "state directory %s already initialized; nothing changed\n", cfg.StateDir)
				return nil
			}
			for _, f := range res.Created {
				fmt.Fprintf(stdout, "created %s\n", f)
			}
			return nil
		},
	}
	bindFlags(cmd.Flags(), "state-dir", "hostname", "config")
	return cmd
}

func newMigrateCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply database migrations (to --database-url, or the embedded database under --state-dir)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			v, err := Migrate(cmd.Context(), cfg, newLogger(cfg, stderr))
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "schema at version %d\n", v)
			return nil
		},
	}
	bindFlags(cmd.Flags(), "state-dir", "database-url", "log-level", "log-format", "config")
	return cmd
}

func newVersionCmd(version string, stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			fmt.Fprintf(stdout, "gpuaas-controller %s\n", version)
		},
	}
}

// Main runs the command line and returns the exit code.
func Main(version string, args []string, stdout, stderr io.Writer) int {
	root := NewRootCmd(version, stdout, stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(stderr, "gpuaas-controller: %v\n", err)
		return 1
	}
	return 0
}
