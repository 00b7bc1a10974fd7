// Package healthcmd is `gpuaasctl health`: the fleet's slot health by node, worst first, and
// the signal -> action policy table (admin).
package healthcmd

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// Options are `health`'s dependencies and flags.
type Options struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Output output.Format
}

// NewCmdHealth is `health` (the fleet summary) with its `policy` subcommand.
func NewCmdHealth(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Fleet health by node, worst first: quarantined and degraded slots, drains (admin)",
		Args:  cmdutil.ExactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(opts)
			}
			return fleetRun(cmd.Context(), opts)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	cmd.AddCommand(newCmdPolicy(f))
	return cmd
}

func fleetRun(ctx context.Context, opts *Options) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	nodes, err := c.FleetHealth(ctx)
	if err != nil {
		return err
	}
	return output.Print(opts.IO.Out, opts.Output, apiv1.List[apiv1.NodeHealth]{Items: nodes}, func(t *output.TableWriter) {
		t.Header("nodes", len(nodes), "NODE", "QUARANTINED", "DEGRADED", "HEALTHY", "SLOTS", "DRAINING", "LAST EVENT")
		for _, n := range nodes {
			drain := "-"
			if n.Draining {
				drain = "yes"
				if n.DrainReason != "" {
					drain += " (" + n.DrainReason + ")"
				}
			}
			last := "-"
			if n.LastEventAt != nil {
				last = output.TimePtr(n.LastEventAt) + " " + n.LastEvent
			}
			t.Row(n.Node, n.Quarantined, n.Degraded, n.Healthy, n.Slots, drain, last)
		}
	})
}

func newCmdPolicy(f *cmdutil.Factory) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "The signal -> action policy table, each row with its source",
		Args:  cmdutil.ExactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := opts.Client()
			if err != nil {
				return err
			}
			rules, err := c.HealthPolicy(cmd.Context())
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, apiv1.List[apiv1.HealthRule]{Items: rules}, func(t *output.TableWriter) {
				t.Header("rules", len(rules), "SIGNAL", "ACTION", "MEANING", "SOURCE")
				for _, r := range rules {
					t.Row(r.Signal, r.Action, r.Name, r.Source)
				}
			})
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
