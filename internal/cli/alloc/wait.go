package alloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// pollInterval is how often waits re-read the allocation.
const pollInterval = 500 * time.Millisecond

// WaitOptions are `alloc wait`'s dependencies and flags.
type WaitOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID      string
	For     string
	Timeout time.Duration
	Output  output.Format
}

// NewCmdWait is `alloc wait ID --for active|released`.
func NewCmdWait(f *cmdutil.Factory, runF func(*WaitOptions) error) *cobra.Command {
	opts := &WaitOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "wait ID [--for active|released]",
		Short: "Wait for an allocation to become active (or released), showing the host's phases",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if opts.For != "active" && opts.For != "released" {
				return cmdutil.FlagErrorf("--for must be active or released, not %q", opts.For)
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			if opts.ID, err = cmdutil.AllocationID(cmd.Context(), c, opts.ID); err != nil {
				return err
			}
			a, err := waitFor(cmd.Context(), opts.IO.ErrOut, c, &apiv1.Allocation{ID: opts.ID}, opts.For, opts.Timeout)
			if err != nil {
				return err
			}
			return printList(opts.IO.Out, opts.Output, a, []apiv1.Allocation{*a})
		},
	}
	cmd.Flags().StringVar(&opts.For, "for", "active", "state to wait for: active or released")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 30*time.Minute, "give up after this long")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// waitFor polls allocation from.ID until it reaches target, writing each host phase to
// progress once, as it completes; phases already in from (the answer that started the wait,
// e.g. a release's) are not repeated. A failed allocation is an error carrying its reason.
func waitFor(ctx context.Context, progress io.Writer, c *client.Client, from *apiv1.Allocation, target string, timeout time.Duration) (*apiv1.Allocation, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	id := from.ID
	start := time.Now()
	seen := map[string]bool{}
	running := map[string]string{} // phase in flight -> last progress shown
	phaseKey := func(tk apiv1.AllocationTask, p apiv1.TaskPhase) string {
		return fmt.Sprintf("%s/%d/%s", tk.ID, tk.Attempt, p.Name)
	}
	for _, tk := range from.Tasks {
		for _, p := range tk.Phases {
			seen[phaseKey(tk, p)] = true
		}
	}
	var last *apiv1.Allocation
	plog := &phaseLog{w: progress, live: output.Styled(progress), start: start}
	defer plog.close()
	err := cmdutil.Poll(ctx, pollInterval, func(ctx context.Context) (bool, error) {
		a, err := c.GetAllocation(ctx, id)
		if err != nil {
			return false, err
		}
		last = a
		for _, tk := range a.Tasks {
			for _, p := range tk.Phases {
				key := phaseKey(tk, p)
				if seen[key] {
					continue
				}
				if p.Status == "running" {
					if running[key] != p.Detail && !plog.live {
						running[key] = p.Detail
						plog.line(fmt.Sprintf("[%6.1fs] %s #%d %-26s %-6s %s", time.Since(start).Seconds(), tk.Type, tk.Attempt, p.Name, p.Status, p.Detail))
					}
					continue
				}
				seen[key] = true
				line := fmt.Sprintf("[%6.1fs] %s #%d %-26s %-6s %s", time.Since(start).Seconds(), tk.Type, tk.Attempt, p.Name, phaseStatus(a, p), output.Millis(p.DurationMS))
				if p.Error != "" {
					line += "  " + p.Error
				} else if p.Detail != "" {
					line += "  " + p.Detail
				}
				plog.line(line)
			}
		}
		if n := len(a.Tasks); n > 0 {
			plog.progress(a.Tasks[n-1])
		}
		if a.Status == target {
			return true, nil
		}
		return false, unreachable(a, target)
	})
	if errors.Is(err, context.DeadlineExceeded) && last != nil {
		return nil, fmt.Errorf("allocation %s is still %s after %s", id, last.Status, timeout)
	}
	if err != nil {
		return nil, err
	}
	return last, nil
}

// unreachable says why an allocation in its current state can never reach target (nil when
// it still can): a failed allocation ends the wait (exit 1), and one that is releasing or
// released can never become active (exit 5), so `alloc wait` returns at once instead of
// polling until its timeout.
func unreachable(a *apiv1.Allocation, target string) error {
	switch {
	case a.Status == "failed":
		return fmt.Errorf("allocation %s failed: %s", a.ID, output.Dash(a.FailureReason))
	case target == "active" && (a.Status == "releasing" || a.Status == "released"):
		return &cmdutil.StateError{Code: cmdutil.ExitConflict,
			Err: fmt.Errorf("allocation %s is %s: it will not become active (gpuaasctl alloc show %s)", a.ID, a.Status, a.ID)}
	}
	return nil
}
