// Package topology is `gpuaasctl topology`: run a signed topology discovery on a node's host
// daemon and review the candidate slots it proposes (admin). Approval is `slots approve`.
package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/topology"
)

// NewCmdTopology is the `topology` command group.
func NewCmdTopology(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "topology", Short: "Discover a node's GPUs, NVMe and fabric, and review candidate slots (admin)"}
	return cmdutil.Group(cmd, NewCmdDiscover(f, nil), NewCmdShow(f, nil))
}

// Options are the dependencies and flags of the topology commands.
type Options struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node    string
	Wait    bool // discover
	Timeout time.Duration
	Output  output.Format
}

// NewCmdDiscover is `topology discover NODE [--wait]`.
func NewCmdDiscover(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "discover NODE [--wait]",
		Short: "Queue a signed topology discovery on the node's host daemon",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if runF != nil {
				return runF(opts)
			}
			return discoverRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait for the host's report")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 5*time.Minute, "with --wait: give up after this long")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func discoverRun(ctx context.Context, opts *Options) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	d, err := c.DiscoverTopology(ctx, opts.Node)
	if err != nil {
		return err
	}
	if opts.Wait && d.Status != "succeeded" {
		wctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
		err = cmdutil.Poll(wctx, 500*time.Millisecond, func(ctx context.Context) (bool, error) {
			if d, err = c.GetTopology(ctx, opts.Node); err != nil {
				return false, err
			}
			switch d.Status {
			case "succeeded":
				return true, nil
			case "failed", "refused", "expired":
				return false, fmt.Errorf("discovery %s: %s", d.Status, output.Dash(d.Error))
			}
			return false, nil
		})
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("discovery still %s after %s (is the host daemon running?)", d.Status, opts.Timeout)
		}
		if err != nil {
			return err
		}
	}
	return printDiscovery(opts.IO.Out, opts.Output, d)
}

// NewCmdShow is `topology show NODE`.
func NewCmdShow(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "show NODE",
		Short: "Show the latest discovery: devices, and candidates with their blocking reasons",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			d, err := c.GetTopology(cmd.Context(), opts.Node)
			if err != nil {
				return err
			}
			return printDiscovery(opts.IO.Out, opts.Output, d)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func printDiscovery(w io.Writer, o output.Format, d *apiv1.Discovery) error {
	var printErr error
	err := output.Print(w, o, d, func(t *output.TableWriter) {
		t.Row("Node:", d.NodeID)
		t.Row("Task:", d.TaskID)
		t.Row("Status:", d.Status)
		t.Row("Completed:", output.TimePtr(d.CompletedAt))
		if d.Error != "" {
			t.Row("Error:", d.Error)
		}
		var rep topology.Report
		if len(d.Report) == 0 || json.Unmarshal(d.Report, &rep) != nil {
			return
		}
		printErr = t.Raw(func(w io.Writer) error {
			fmt.Fprintln(w)
			return topology.PrintTable(w, &rep)
		})
	})
	return errors.Join(printErr, err)
}
