// Package audit is `gpuaasctl audit`: the controller's audit log, newest first (admin).
package audit

import (
	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// Options are `audit`'s dependencies and flags.
type Options struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Limit    int
	Action   string
	TargetID string
	Output   output.Format
}

// NewCmdAudit is `audit [--limit N]`, also spelt `audit list`.
func NewCmdAudit(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	cmd := newCmd(f, runF, "audit [--limit N]", "Show the audit log, newest first (admin)")
	cmd.AddCommand(newCmd(f, runF, "list [--limit N]", "Show the audit log, newest first (same as `audit`)"))
	return cmd
}

func newCmd(f *cmdutil.Factory, runF func(*Options) error, use, short string) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Limit < 1 || opts.Limit > 1000 {
				return cmdutil.FlagErrorf("--limit must be between 1 and 1000")
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			items, err := c.ListAudit(cmd.Context(), client.AuditQuery{Limit: opts.Limit, Action: opts.Action, TargetID: opts.TargetID})
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, output.List(items), func(t *output.TableWriter) {
				t.Header("audit entries", len(items), "AT", "ACTOR", "ROLE", "ACTION", "TARGET", "TENANT")
				for _, e := range items {
					t.Row(output.Time(e.At), e.Actor, e.ActorRole, e.Action, e.TargetKind+"/"+e.TargetID, output.Dash(e.TenantID))
				}
			})
		},
	}
	cmd.Flags().IntVar(&opts.Limit, "limit", 50, "entries to show (1..1000)")
	cmd.Flags().StringVar(&opts.Action, "action", "", "only this action, e.g. allocation.create")
	cmd.Flags().StringVar(&opts.TargetID, "target", "", "only entries about this target id")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
