// Package version is `gpuaasctl version`: the client's build and, when a controller is
// configured and answers, the server's.
package version

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

type versions struct {
	Client      string `json:"client"`
	Server      string `json:"server,omitempty"`
	ServerError string `json:"server_error,omitempty"`
}

// NewCmdVersion prints gpuaasctl's version and the controller's. It needs no configuration:
// without one (or with --client) only the client's is shown.
func NewCmdVersion(f *cmdutil.Factory) *cobra.Command {
	clientOnly := false
	format := output.Table
	cmd := &cobra.Command{
		Use:   "version [--client]",
		Short: "Print the gpuaasctl version and the controller's",
		Args:  cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := versions{Client: f.AppVersion}
			if !clientOnly {
				if c, err := f.Client(); err != nil {
					v.ServerError = err.Error()
				} else {
					ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
					defer cancel()
					if w, err := c.Whoami(ctx); err != nil {
						v.ServerError = err.Error()
					} else {
						v.Server = w.ServerVersion
					}
				}
			}
			return output.Print(f.IO.Out, format, v, func(t *output.TableWriter) {
				t.Row("Client:", "gpuaasctl "+v.Client)
				switch {
				case clientOnly:
				case v.Server != "":
					t.Row("Server:", "gpuaas-controller "+v.Server)
				default:
					t.Row("Server:", fmt.Sprintf("unknown (%s)", v.ServerError))
				}
			})
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "only the client's version (no request)")
	cmdutil.AddOutputFlag(cmd, &format)
	return cmd
}
