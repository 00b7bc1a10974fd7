// Package cli is gpuaasctl, the gpuaas operator and tenant command line. Main builds one
// cmdutil.Factory, the command tree (one package per noun: alloc, nodes, slots, ...), runs
// it, prints any error with a hint, and maps it to the exit status in one place
// (cmdutil.ExitCode). It is callable in-process, which is how testscript runs it.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/buildinfo"
	"github.com/gpuaas/gpuaas/internal/cli/alloc"
	"github.com/gpuaas/gpuaas/internal/cli/audit"
	"github.com/gpuaas/gpuaas/internal/cli/capacity"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/config"
	"github.com/gpuaas/gpuaas/internal/cli/configcmd"
	"github.com/gpuaas/gpuaas/internal/cli/dashboardcmd"
	"github.com/gpuaas/gpuaas/internal/cli/events"
	"github.com/gpuaas/gpuaas/internal/cli/healthcmd"
	"github.com/gpuaas/gpuaas/internal/cli/images"
	"github.com/gpuaas/gpuaas/internal/cli/nodes"
	"github.com/gpuaas/gpuaas/internal/cli/quota"
	"github.com/gpuaas/gpuaas/internal/cli/reservations"
	"github.com/gpuaas/gpuaas/internal/cli/skus"
	"github.com/gpuaas/gpuaas/internal/cli/slots"
	"github.com/gpuaas/gpuaas/internal/cli/sshcmd"
	"github.com/gpuaas/gpuaas/internal/cli/storage"
	"github.com/gpuaas/gpuaas/internal/cli/tasks"
	"github.com/gpuaas/gpuaas/internal/cli/tenants"
	"github.com/gpuaas/gpuaas/internal/cli/tokens"
	"github.com/gpuaas/gpuaas/internal/cli/topology"
	"github.com/gpuaas/gpuaas/internal/cli/version"
	"github.com/gpuaas/gpuaas/internal/cli/webhooks"
	"github.com/gpuaas/gpuaas/internal/cli/whoami"
)

// Main runs gpuaasctl with args (without the program name) and returns the exit status.
// SIGINT/SIGTERM cancel the running request or wait.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, cmdutil.IOStreams{In: stdin, Out: stdout, ErrOut: stderr}, os.Getenv)
}

// Run is Main with the context and environment given: tests use it with buffers and a fake
// environment.
func Run(ctx context.Context, args []string, ios cmdutil.IOStreams, getenv func(string) string) int {
	f := cmdutil.New(ios, getenv, buildinfo.String())
	root := NewCmdRoot(f)
	root.SetArgs(args)
	root.SetIn(ios.In)
	root.SetOut(ios.Out)
	root.SetErr(ios.ErrOut)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return cmdutil.ExitOK
	}
	printError(ios.ErrOut, f, err)
	var fe *cmdutil.FlagError
	if errors.As(err, &fe) && cmd != nil {
		fmt.Fprintf(ios.ErrOut, "\n%s", cmd.UsageString())
	}
	return cmdutil.ExitCode(err)
}

const rootLong = `gpuaasctl drives the gpuaas controller's HTTPS API: tenants create and release GPU
allocations; operators register nodes, apply slot maps and manage the catalog.

Configuration, highest precedence first:
  flags        --server, --ca-file, --token, --token-file
  environment  GPUAAS_SERVER, GPUAAS_CA_FILE, GPUAAS_TOKEN, GPUAAS_TOKEN_FILE, GPUAAS_REGION
  config file  ~/.config/gpuaas/config.yaml ($XDG_CONFIG_HOME/gpuaas/config.yaml when set):
               named contexts (server, ca_file, token or token_file, region), the one named
               by --context or GPUAAS_CONTEXT, else current_context. 'gpuaasctl login' and
               'gpuaasctl config' write it (0600).
A token and a token file are one setting: the highest layer that sets either wins.
The server must be https://; --ca-file trusts the controller's CA (STATE_DIR/tls/ca.crt).

Commands that print resources take -o table|json|yaml; json and yaml use the API's field
names. Progress and notices go to standard error.

Exit status:
  0  success
  1  other error
  2  usage: bad flag or argument; invalid_request, payload_too_large
  3  unauthorized or forbidden, or no token configured
  4  not_found
  5  conflict, idempotency_key_reused, cursor_expired
  6  sku_unavailable (the reason is printed; see 'gpuaasctl alloc explain'), quota_exceeded
  7  controller unreachable, or unavailable (retryable)`

// NewCmdRoot builds the gpuaasctl command tree around f.
func NewCmdRoot(f *cmdutil.Factory) *cobra.Command {
	root := &cobra.Command{
		Use:           "gpuaasctl",
		Short:         "Operate and use gpuaas: GPU nodes, slots, catalog and allocations",
		Long:          rootLong,
		Version:       f.AppVersion,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("gpuaasctl {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &cmdutil.FlagError{Err: err} })
	pf := root.PersistentFlags()
	pf.Var(config.ServerFlag{P: &f.Flags.Server}, "server", "controller URL, https://host:port (repeat or comma-separate to fail over between replicas)")
	pf.StringVar(&f.Flags.CAFile, "ca-file", "", "CA certificate (PEM) to trust for the controller")
	pf.StringVar(&f.Flags.Token, "token", "", "API token")
	pf.StringVar(&f.Flags.TokenFile, "token-file", "", "file holding the API token")
	pf.StringVar(&f.Flags.Context, "context", "", "config-file context to use (default: current_context; env GPUAAS_CONTEXT)")

	root.AddGroup(
		&cobra.Group{ID: "tenant", Title: "Tenant and admin commands:"},
		&cobra.Group{ID: "admin", Title: "Admin commands:"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add("tenant",
		whoami.NewCmdWhoami(f, nil),
		skus.NewCmdSKUs(f),
		capacity.NewCmdCapacity(f, nil),
		alloc.NewCmdAlloc(f),
		reservations.NewCmdReservations(f),
		quota.NewCmdQuota(f, nil),
		sshcmd.NewCmdSSH(f, nil),
		sshcmd.NewCmdSSHConfig(f),
		sshcmd.NewCmdSessions(f),
		events.NewCmdEvents(f, nil),
		webhooks.NewCmdWebhooks(f),
	)
	add("admin",
		nodes.NewCmdNodes(f),
		slots.NewCmdSlots(f),
		healthcmd.NewCmdHealth(f, nil),
		topology.NewCmdTopology(f),
		storage.NewCmdStorage(f),
		images.NewCmdImages(f),
		tenants.NewCmdTenants(f),
		tokens.NewCmdTokens(f),
		tasks.NewCmdTasks(f),
		audit.NewCmdAudit(f, nil),
		dashboardcmd.NewCmdDashboard(f),
	)
	root.AddCommand(version.NewCmdVersion(f), configcmd.NewCmdConfig(f), configcmd.NewCmdLogin(f))
	root = cmdutil.Group(root)
	cmdutil.AddDynamicCompletion(root, f)
	return root
}
