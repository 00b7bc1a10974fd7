package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/task"
)

// ReconcileOptions are `nodes reconcile`'s dependencies and flags.
type ReconcileOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node    string
	Show    bool // only show the latest report
	Wait    bool
	Timeout time.Duration
	Output  output.Format
}

// NewCmdReconcile is `nodes reconcile NODE [--wait]`.
func NewCmdReconcile(f *cmdutil.Factory, runF func(*ReconcileOptions) error) *cobra.Command {
	opts := &ReconcileOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "reconcile NODE [--wait | --show]",
		Short: "Compare what the controller expects on a node with its host: domains, leases, DHCP, disks, devices",
		Long: `Queues a signed slice.reconcile on the node's host daemon. The host reports, per slot of
each live allocation, whether its domain runs, its lease and DHCP reservation exist, its disk
is unmounted and (on real hosts) its GPU and VF sit on vfio-pci, plus gpuaas domains, leases
and reservations that no allocation accounts for. An available slot leased by nobody is
disabled; everything else is shown and audited for an operator to act on. The controller
also runs this periodically (--reconcile-interval).`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if runF != nil {
				return runF(opts)
			}
			return reconcileRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait for the host's report")
	cmd.Flags().BoolVar(&opts.Show, "show", false, "show the latest report without queueing a new check")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 2*time.Minute, "with --wait: give up after this long")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func reconcileRun(ctx context.Context, opts *ReconcileOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	var r *apiv1.Reconcile
	if opts.Show {
		r, err = c.GetReconcile(ctx, opts.Node)
	} else {
		r, err = c.Reconcile(ctx, opts.Node)
	}
	if err != nil {
		return err
	}
	if opts.Wait && !opts.Show && r.Status != "succeeded" {
		taskID := r.TaskID
		wctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
		err = cmdutil.Poll(wctx, 500*time.Millisecond, func(ctx context.Context) (bool, error) {
			if r, err = c.GetReconcile(ctx, opts.Node); err != nil {
				return false, err
			}
			if r.TaskID != taskID {
				return false, nil // a newer periodic check; keep waiting for ours
			}
			switch r.Status {
			case "succeeded":
				return true, nil
			case "failed", "refused", "expired":
				return false, fmt.Errorf("reconcile %s: %s", r.Status, output.Dash(r.Error))
			}
			return false, nil
		})
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("reconcile still %s after %s (is the host daemon running?)", r.Status, opts.Timeout)
		}
		if err != nil {
			return err
		}
	}
	return printReconcile(opts.IO.Out, opts.Output, r)
}

func printReconcile(w io.Writer, o output.Format, r *apiv1.Reconcile) error {
	if o != output.Table {
		return output.Print(w, o, r, nil)
	}
	fmt.Fprintf(w, "Task:    %s (%s)\n", r.TaskID, r.Status)
	if r.Error != "" {
		fmt.Fprintf(w, "Error:   %s\n", r.Error)
	}
	if r.Status != "succeeded" || len(r.Report) == 0 {
		return nil
	}
	var rep task.ReconcileReport
	if err := json.Unmarshal(r.Report, &rep); err != nil {
		return fmt.Errorf("reconcile report: %w", err)
	}
	drift := 0
	for _, s := range rep.Slots {
		if len(s.Drift) > 0 {
			drift++
		}
	}
	sim := ""
	if rep.Simulated {
		sim = " (simulated: no host objects)"
	}
	fmt.Fprintf(w, "Runtime: %s%s\nChecked: %s\nDrift:   %d of %d slots; orphans: %d domains, %d leases, %d reservations\n\n",
		rep.Runtime, sim, rep.CheckedAt.Format(time.RFC3339), drift, len(rep.Slots), len(rep.OrphanDomains), len(rep.OrphanLeases), len(rep.OrphanReservations))
	err := output.Print(w, output.Table, nil, func(t *output.TableWriter) {
		t.Row("SLOT", "ALLOCATION", "DOMAIN", "DRIFT")
		for _, s := range rep.Slots {
			t.Row(s.SlotIndex, s.AllocationID, s.DomainState, output.Dash(strings.Join(s.Drift, "; ")))
		}
	})
	if err != nil {
		return err
	}
	for _, x := range []struct {
		label string
		items []string
	}{{"orphan domain", rep.OrphanDomains}, {"orphan lease (slot)", rep.OrphanLeases}, {"orphan DHCP reservation", rep.OrphanReservations}} {
		for _, it := range x.items {
			fmt.Fprintf(w, "%s: %s\n", x.label, it)
		}
	}
	return nil
}
