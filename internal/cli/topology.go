package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/topology"
)

// NewCmdTopology is `gpuaasctl topology`: host discovery and its candidate bundles (admin).
func NewCmdTopology(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "topology", Short: "Discover a node's GPUs, NVMe and fabric, and review candidate slots (admin)"}
	var wait bool
	var timeout time.Duration
	discover := &cobra.Command{
		Use:   "discover NODE [--wait]",
		Short: "Queue a signed topology discovery on the node's host daemon",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			d, err := c.DiscoverTopology(ctxb(), args[0])
			if err != nil {
				return err
			}
			deadline := time.Now().Add(timeout)
			for wait && d.Status != "succeeded" {
				if d.Status == "failed" || d.Status == "refused" || d.Status == "expired" {
					return fmt.Errorf("discovery %s: %s", d.Status, d.Error)
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("discovery still %s after %s (is the host daemon running?)", d.Status, timeout)
				}
				time.Sleep(500 * time.Millisecond) // status poll interval
				if d, err = c.GetTopology(ctxb(), args[0]); err != nil {
					return err
				}
			}
			return printDiscovery(f, cfg.Output, d)
		},
	}
	discover.Flags().BoolVar(&wait, "wait", false, "wait for the host's report")
	discover.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "with --wait: give up after this long")
	show := &cobra.Command{
		Use:   "show NODE",
		Short: "Show the latest discovery: devices and candidates with blocking reasons",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			d, err := c.GetTopology(ctxb(), args[0])
			if err != nil {
				return err
			}
			return printDiscovery(f, cfg.Output, d)
		},
	}
	cmd.AddCommand(discover, show)
	return cmd
}

func printDiscovery(f *Factory, format string, d *apiv1.Discovery) error {
	return render(f.IO.Out, format, d, func(t *tabwriter.Writer) {
		row(t, "Task:", d.TaskID)
		row(t, "Status:", d.Status)
		if d.Error != "" {
			row(t, "Error:", d.Error)
		}
		var rep topology.Report
		if len(d.Report) == 0 || json.Unmarshal(d.Report, &rep) != nil {
			return
		}
		_ = t.Flush()
		fmt.Fprintln(f.IO.Out)
		_ = topology.PrintTable(f.IO.Out, &rep)
	})
}

func newCmdSlotsApprove(f *Factory) *cobra.Command {
	var req apiv1.SlotApprove
	var yes bool
	cmd := &cobra.Command{
		Use:   "approve NODE (--all-ready | --slot N ...) [--dry-run] --yes",
		Short: "Promote discovered candidates into approved, schedulable slots",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if !req.AllReady && len(req.SlotIndexes) == 0 {
				return &FlagError{Err: fmt.Errorf("--all-ready or --slot is required")}
			}
			if !yes && !req.DryRun {
				return &FlagError{Err: fmt.Errorf("approving slots makes their disks tenant storage (wiped on every release): confirm with --yes, or use --dry-run")}
			}
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			res, err := c.ApproveSlots(ctxb(), args[0], req)
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, res, func(t *tabwriter.Writer) {
				row(t, "SLOT", "ACTION", "FIELDS")
				for _, ch := range res.Changes {
					row(t, ch.SlotIndex, ch.Action, dash(strings.Join(ch.Fields, ",")))
				}
				if res.Applied {
					row(t, "approved")
				} else {
					row(t, "dry run: nothing changed")
				}
			})
		},
	}
	cmd.Flags().BoolVar(&req.AllReady, "all-ready", false, "approve every ready candidate")
	cmd.Flags().IntSliceVar(&req.SlotIndexes, "slot", nil, "approve these candidate slot indexes")
	cmd.Flags().BoolVar(&req.DryRun, "dry-run", false, "show the resulting slot-map diff only")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm")
	return cmd
}
