package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/task"
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
		var drift *apiv1.Reconcile
		if opts.Output == output.Table {
			drift, _ = c.GetReconcile(ctx, opts.Node) // none yet is normal
		}
		return output.Print(w, opts.Output, n, func(t *output.TableWriter) {
			printDetail(t, n)
			printDrift(t, drift)
		})
	})
}

func printDetail(t *output.TableWriter, n *apiv1.Node) {
	t.Row("Name:", n.Name+" ("+n.ID+")")
	t.Row("Region:", n.Region)
	t.Row("Status:", n.Status)
	t.Row("Mode:", n.Mode)
	t.Row("Draining:", n.Draining)
	if n.Simulated {
		t.Row("Simulated:", "SIMULATED: its hostd reported the sim runtime (no VMs, no disk writes); enroll it again to clear")
	}
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
	if v := agentVersion(n.AgentFacts); v != "" {
		t.Row("Agent version:", v)
	}
	for i, w := range n.Waiting {
		label := ""
		if i == 0 {
			label = "Tasks waiting:"
		}
		t.Row(label, w)
	}

	sc := n.Schedulable
	t.Row("Schedulable:", fmt.Sprintf("baremetal=%s slice=%s", yesNo(sc.Baremetal), yesNo(sc.Slice)))
	for _, r := range sc.Reasons {
		t.Row("", "- "+r)
	}
	// The MAAS profile contract (profile tag, verified firmware evidence, approved slots) is
	// what a fleet rollout checks; placement needs only what Schedulable says, so a node can
	// take slices with it incomplete: say so instead of a flat "no" beside "slice=yes".
	sup := "complete"
	switch {
	case !sc.SliceSupported && sc.Slice:
		sup = "incomplete (slices are placed without it), missing: " + output.Dash(strings.Join(sc.SliceMissing, ", "))
	case !sc.SliceSupported:
		sup = "incomplete, missing: " + output.Dash(strings.Join(sc.SliceMissing, ", "))
	}
	t.Row("Slice profile:", sup)

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
	printImageCache(t, n.AgentFacts)
}

// imageCache is the part of a heartbeat's facts that describes the host's image cache.
type imageCache struct {
	Facts struct {
		ImageCache *struct {
			BudgetBytes int64 `json:"budget_bytes"`
			UsedBytes   int64 `json:"used_bytes"`
			Images      []struct {
				Digest   string    `json:"digest_sha256"`
				Size     int64     `json:"size_bytes"`
				LastUsed time.Time `json:"last_used"`
				Pinned   bool      `json:"pinned"`
			} `json:"images"`
			Hits      int64 `json:"hits"`
			Downloads int64 `json:"downloads"`
			Evictions int64 `json:"evictions"`
		} `json:"image_cache"`
	} `json:"facts"`
}

// printImageCache lists the images the host's cache holds, as its last heartbeat said.
func printImageCache(t *output.TableWriter, facts json.RawMessage) {
	var hb imageCache
	if len(facts) == 0 || json.Unmarshal(facts, &hb) != nil || hb.Facts.ImageCache == nil {
		t.Row("Image cache:", "not reported (sim runtime, or no heartbeat yet)")
		return
	}
	c := hb.Facts.ImageCache
	budget := "unbounded"
	if c.BudgetBytes > 0 {
		budget = fmt.Sprintf("budget %d bytes", c.BudgetBytes)
	}
	t.Row("Image cache:", fmt.Sprintf("%d images, %d bytes (%s); hits=%d downloads=%d evictions=%d",
		len(c.Images), c.UsedBytes, budget, c.Hits, c.Downloads, c.Evictions))
	for _, im := range c.Images {
		use := ""
		if im.Pinned {
			use = " in use"
		}
		t.Row("", fmt.Sprintf("- %s… %d bytes, last used %s%s", im.Digest[:min(16, len(im.Digest))], im.Size, output.Time(im.LastUsed), use))
	}
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

// printDrift summarises the node's latest reconcile: host state that differs from the plan.
func printDrift(t *output.TableWriter, r *apiv1.Reconcile) {
	if r == nil {
		t.Row("Drift:", "not checked yet (gpuaasctl nodes reconcile NODE)")
		return
	}
	if r.Status != "succeeded" {
		t.Row("Drift:", fmt.Sprintf("latest check %s %s", output.Short(r.TaskID), r.Status))
		return
	}
	var rep task.ReconcileReport
	if json.Unmarshal(r.Report, &rep) != nil {
		return
	}
	var lines []string
	for _, s := range rep.Slots {
		if len(s.Drift) > 0 {
			lines = append(lines, fmt.Sprintf("slot %d: %s", s.SlotIndex, strings.Join(s.Drift, "; ")))
		}
	}
	for _, x := range [][2]string{{"orphan domains", strings.Join(rep.OrphanDomains, ", ")}, {"orphan leases", strings.Join(rep.OrphanLeases, ", ")},
		{"orphan DHCP reservations", strings.Join(rep.OrphanReservations, ", ")}} {
		if x[1] != "" {
			lines = append(lines, x[0]+": "+x[1])
		}
	}
	when := output.Time(rep.CheckedAt)
	if len(lines) == 0 {
		t.Row("Drift:", "none (checked "+when+")")
		return
	}
	t.Row("Drift:", fmt.Sprintf("%d findings (checked %s)", len(lines), when))
	for _, l := range lines {
		t.Row("", "- "+l)
	}
}

// agentVersion is the gpuaas-hostd version of the node's last heartbeat ("" before one).
func agentVersion(facts json.RawMessage) string {
	var hb struct {
		AgentVersion string `json:"agent_version"`
	}
	_ = json.Unmarshal(facts, &hb)
	return hb.AgentVersion
}
