package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/buildinfo"
)

// NewRootCmd builds the gpuaasctl command tree.
func NewRootCmd(f *Factory) *cobra.Command {
	root := &cobra.Command{
		Use:   "gpuaasctl",
		Short: "Operate and use gpuaas: GPU nodes, slots, allocations",
		Long: `gpuaasctl talks to the gpuaas controller over HTTPS.

Configuration: flags > environment (GPUAAS_SERVER, GPUAAS_CA_FILE, GPUAAS_TOKEN,
GPUAAS_TOKEN_FILE, GPUAAS_OUTPUT) > ~/.config/gpuaas/config.yaml (keys server, ca_file,
token, token_file, output).

Exit codes: 0 ok, 1 error, 2 usage or invalid request, 3 unauthorized/forbidden,
4 not found, 5 conflict, 6 sku_unavailable, 7 controller unreachable/unavailable.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.String("server", "", "controller URL (https://host:port)")
	pf.String("ca-file", "", "CA certificate to trust (PEM)")
	pf.String("token", "", "API token")
	pf.String("token-file", "", "file holding the API token")
	pf.StringP("output", "o", "", "output format: table, json or yaml")
	f.Flags = pf
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &FlagError{Err: err} })
	root.AddCommand(
		NewCmdVersion(f),
		NewCmdWhoami(f),
		NewCmdSKUs(f),
		NewCmdCapacity(f),
		NewCmdAlloc(f),
		NewCmdNodes(f),
		NewCmdSlots(f),
		NewCmdImages(f),
		NewCmdTenants(f),
		NewCmdTokens(f),
		NewCmdAudit(f),
		NewCmdTasks(f),
		NewCmdTopology(f),
	)
	return root
}

// Main runs gpuaasctl and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return Execute(&Factory{IO: IOStreams{In: stdin, Out: stdout, ErrOut: stderr}, Getenv: os.Getenv}, args)
}

// Execute runs the command tree with f and maps the outcome to an exit code; usage is
// printed only for flag and argument errors.
func Execute(f *Factory, args []string) int {
	root := NewRootCmd(f)
	root.SetArgs(args)
	root.SetOut(f.IO.Out)
	root.SetErr(f.IO.ErrOut)
	cmd, err := root.ExecuteContextC(context.Background())
	if err == nil {
		return ExitOK
	}
	server := ""
	if c, cerr := f.Config(); cerr == nil {
		server = c.Server
	}
	printError(f.IO.ErrOut, err, server)
	var fe *FlagError
	if errors.As(err, &fe) || isCobraUsage(err) {
		if cmd != nil {
			_, _ = io.WriteString(f.IO.ErrOut, "\n"+cmd.UsageString())
		}
		return ExitUsage
	}
	return exitCode(err)
}

// isCobraUsage catches cobra's own argument errors (wrong arg count, unknown command).
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"accepts ", "requires at least", "unknown command", "unknown flag", "unknown shorthand", "invalid argument"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// NewCmdVersion prints the version.
func NewCmdVersion(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the gpuaasctl version",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			_, _ = io.WriteString(f.IO.Out, "gpuaasctl "+buildinfo.String()+"\n")
		},
	}
}
