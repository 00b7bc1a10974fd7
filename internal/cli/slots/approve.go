package slots

import (
	"context"
	"encoding/json"
	"fmt"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/cpuset"
	"github.com/gpuaas/gpuaas/internal/topology"
	"github.com/gpuaas/gpuaas/internal/tui/approve"
)

// ApproveOptions are `slots approve`'s dependencies and flags.
type ApproveOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node             string
	HousekeepingCPUs *string // --housekeeping-cpus when given
	AllReady         bool
	SlotIndexes      []int
	DryRun           bool
	Yes              bool
	Output           output.Format
}

// NewCmdApprove is `slots approve NODE`.
func NewCmdApprove(f *cmdutil.Factory, runF func(*ApproveOptions) error) *cobra.Command {
	opts := &ApproveOptions{IO: f.IO, Client: f.Client}
	var housekeeping string
	cmd := &cobra.Command{
		Use:   "approve NODE [(--all-ready | --index N,...) (--dry-run | --yes)]",
		Short: "Promote discovered candidates (see `topology show`) into approved, schedulable slots",
		Long: `Promote discovered candidates into approved, schedulable slots.

On a terminal, with no selection flags, an interactive screen lists the candidates: space
toggles a ready row (blocked rows show why and cannot be chosen), enter shows the diff
against the node's slots from a controller dry run, y approves. For scripts: --all-ready or
--index 0,1,2, with --dry-run or --yes.

Each approved slot gets its own host CPU set: whole cores of its NUMA node (SMT siblings
together), disjoint from every other slot's and from the node's housekeeping set, which is
kept back for the host. The housekeeping set is --housekeeping-cpus when given ("" keeps no
CPU back), else the node's, else the first core of each NUMA node. vcpu_count is 24, or the
size of the slot's CPU set when that is smaller.`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if cmd.Flags().Changed("housekeeping-cpus") {
				if _, err := cpuset.Parse(housekeeping); err != nil {
					return cmdutil.FlagErrorf("--housekeeping-cpus: %v", err)
				}
				opts.HousekeepingCPUs = &housekeeping
			}
			if !opts.AllReady && len(opts.SlotIndexes) == 0 {
				if !opts.Yes && !opts.DryRun && opts.IO.Interactive() {
					if runF != nil {
						return runF(opts)
					}
					return approveInteractive(cmd.Context(), opts)
				}
				return cmdutil.FlagErrorf("--all-ready or --index is required (or run on a terminal for the interactive screen)")
			}
			if !opts.Yes && !opts.DryRun {
				return cmdutil.FlagErrorf("approving slots makes their disks tenant storage (wiped on every release): confirm with --yes, or use --dry-run")
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			res, err := c.ApproveSlots(cmd.Context(), opts.Node, apiv1.SlotApprove{
				SlotIndexes: opts.SlotIndexes, AllReady: opts.AllReady, DryRun: opts.DryRun, HousekeepingCPUs: opts.HousekeepingCPUs,
			})
			if err != nil {
				return err
			}
			return printChanges(opts.IO.Out, opts.Output, res, "approved")
		},
	}
	cmd.Flags().BoolVar(&opts.AllReady, "all-ready", false, "approve every ready candidate")
	cmd.Flags().IntSliceVar(&opts.SlotIndexes, "index", nil, "approve these candidate slot indexes, e.g. 0,1,2")
	cmd.Flags().IntSliceVar(&opts.SlotIndexes, "slot", nil, "same as --index")
	cmd.Flags().BoolVar(&opts.DryRun, "dry-run", false, "show the resulting slot-map diff only")
	cmd.Flags().BoolVar(&opts.Yes, "yes", false, "confirm")
	cmd.Flags().StringVar(&housekeeping, "housekeeping-cpus", "", "the node's housekeeping CPU set, kept back from every slot (cpulist, e.g. 0,96)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// approveInteractive runs the approve screen on the terminal.
func approveInteractive(ctx context.Context, opts *ApproveOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	d, err := c.GetTopology(ctx, opts.Node)
	if err != nil {
		return err
	}
	if d.Status != "succeeded" {
		return fmt.Errorf("the latest discovery of %s is %s: run `gpuaasctl topology discover %s --wait`", opts.Node, d.Status, opts.Node)
	}
	var rep topology.Report
	if err := json.Unmarshal(d.Report, &rep); err != nil {
		return fmt.Errorf("discovery report: %w", err)
	}
	m := approve.New(opts.Node, &rep, func(ctx context.Context, idx []int, dryRun bool) (*apiv1.SlotApplyResult, error) {
		return c.ApproveSlots(ctx, opts.Node, apiv1.SlotApprove{SlotIndexes: idx, DryRun: dryRun, HousekeepingCPUs: opts.HousekeepingCPUs})
	})
	final, err := tea.NewProgram(m, tea.WithContext(ctx), tea.WithInput(opts.IO.In), tea.WithOutput(opts.IO.Out)).Run()
	if err != nil {
		return err
	}
	if fm, ok := final.(approve.Model); !ok || fm.Approved == nil {
		fmt.Fprintln(opts.IO.ErrOut, "nothing approved")
		return &cmdutil.SilentError{Code: 1}
	}
	return nil
}
