package nodes

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ShowOptions are `nodes show`'s dependencies and flags.
type ShowOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node   string
	Output output.Format
	Watch  cmdutil.WatchFlags
}

// NewCmdShow is `nodes show NODE`.
func NewCmdShow(f *cmdutil.Factory, runF func(*ShowOptions) error) *cobra.Command {
	opts := &ShowOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "show NODE",
		Short: "Show a node: mode, whether and why it is schedulable, slots by status and SKU",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if runF != nil {
				return runF(opts)
			}
			return showRun(cmd.Context(), opts)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	cmdutil.AddWatchFlags(cmd, &opts.Watch)
	return cmd
}

func showRun(ctx context.Context, opts *ShowOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	return opts.Watch.Render(ctx, opts.IO, func(w io.Writer) error {
		n, err := c.GetNode(ctx, opts.Node)
		if err != nil {
			return err
		}
		return output.Print(w, opts.Output, n, func(t *output.TableWriter) { printDetail(t, n) })
	})
}

func printDetail(t *output.TableWriter, n *apiv1.Node) {
	t.Row("Name:", n.Name+" ("+n.ID+")")
	t.Row("Region:", n.Region)
	t.Row("Status:", n.Status)
	t.Row("Mode:", n.Mode)
	t.Row("Draining:", n.Draining)
	t.Row("Tenant:", output.Dash(n.TenantID))
	t.Row("SKU:", output.Dash(n.SKU))
	t.Row("Slice SKU:", output.Dash(n.SliceSKU))
	t.Row("Profile tags:", output.Dash(strings.Join(n.ProfileTags, ",")))
	t.Row("Hardware tags:", output.Dash(strings.Join(n.HardwareTags, ",")))
	hb := "never"
	if n.LastHeartbeatAt != nil {
		hb = output.Time(*n.LastHeartbeatAt)
	}
	t.Row("Agent heartbeat:", hb)

	sc := n.Schedulable
	t.Row("Schedulable:", fmt.Sprintf("baremetal=%s slice=%s", yesNo(sc.Baremetal), yesNo(sc.Slice)))
	for _, r := range sc.Reasons {
		t.Row("", "- "+r)
	}
	sup := "yes"
	if !sc.SliceSupported {
		sup = "no, missing: " + output.Dash(strings.Join(sc.SliceMissing, ", "))
	}
	t.Row("Slice supported:", sup)

	s := n.SlotSummary
	t.Row("Slots:", fmt.Sprintf("%d total", s.Total))
	statuses := make([]string, 0, len(s.ByStatus))
	for st := range s.ByStatus {
		statuses = append(statuses, st)
	}
	sort.Strings(statuses)
	for _, st := range statuses {
		t.Row("", fmt.Sprintf("%s: %d", st, s.ByStatus[st]))
	}
	t.Row("Available by SKU:", output.Dash(bySKU(s.BySKU)))
	t.Row("Live claims:", fmt.Sprintf("slot=%d node_exclusive=%d", s.LiveSlotClaims, s.LiveExclusiveClaims))
}

func bySKU(v []apiv1.SKUSlots) string {
	parts := make([]string, len(v))
	for i, s := range v {
		parts[i] = fmt.Sprintf("%s=%d", s.SKU, s.Available)
	}
	return strings.Join(parts, " ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
