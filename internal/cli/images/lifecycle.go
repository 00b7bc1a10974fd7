package images

import (
	"context"
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
)

// The image lifecycle commands: test (smoke test), tests, activate, default and rollout.

func printSmokeTests(w io.Writer, o output.Format, v any, tests []apiv1.ImageSmokeTest) error {
	return output.Print(w, o, v, func(t *output.TableWriter) {
		t.Header("smoke tests", len(tests), "ID", "IMAGE", "NODE", "STATUS", "READY IN", "DIGEST", "ALLOCATION", "GPU CHECK", "NOTE")
		for _, s := range tests {
			note := s.FailureReason
			if s.Simulated {
				note = strings.TrimSpace("SIMULATED (sim runtime: nothing booted) " + note)
			}
			if !s.Current {
				note = strings.TrimSpace("not the image's current digest " + note)
			}
			ready := "-"
			if s.Status == "passed" {
				ready = output.Millis(s.TimeToReadyMS)
			}
			t.Row(s.ID, s.Image, s.Node, s.Status, ready, s.DigestSHA256[:16]+"…", s.AllocationID, output.Dash(s.GPUCheck), output.Dash(note))
		}
	})
}

// TestOptions are `images test`'s dependencies and flags.
type TestOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Image   string
	Node    string
	Wait    bool
	Timeout time.Duration
	Output  output.Format
}

// NewCmdTest is `images test ID|SLUG --node NODE [--wait]`.
func NewCmdTest(f *cmdutil.Factory, runF func(*TestOptions) error) *cobra.Command {
	opts := &TestOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "test ID|SLUG --node NODE [--wait]",
		Short: "Smoke-test an image: boot it on a free slot of NODE through the normal provisioning path",
		Long: `Smoke-test an image: a validation allocation of one slot on NODE boots the image through the
same signed provisioning task every slice gets (digest check, signature check when the SKU
requires signed images, disk write, boot, readiness). The test passes when that allocation
becomes active; only a passed test of the image's current digest lets it be activated
(images activate) or made a SKU's default or canary. With --wait the command follows the
allocation, releases it once it passed and waits until it is released (its disks wiped and
verified like any other's, its slot free again), and exits non-zero when the test failed.`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Image = args[0]
			if opts.Node == "" {
				return cmdutil.FlagErrorf("--node is required")
			}
			if runF != nil {
				return runF(opts)
			}
			return testRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Node, "node", "", "node (id or name) whose free slot boots the image")
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait for the outcome, then release the validation allocation and wait for its wipe")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 30*time.Minute, "with --wait: give up after this long")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func testRun(ctx context.Context, opts *TestOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	st, err := c.StartSmokeTest(ctx, opts.Image, opts.Node)
	if err != nil {
		return err
	}
	if !opts.Wait {
		return printSmokeTests(opts.IO.Out, opts.Output, st, []apiv1.ImageSmokeTest{*st})
	}
	fmt.Fprintf(opts.IO.ErrOut, "smoke test %s: allocation %s boots %s on %s\n", st.ID, st.AllocationID, st.Image, st.Node)
	wctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	var a *apiv1.Allocation
	err = cmdutil.Poll(wctx, 500*time.Millisecond, func(ctx context.Context) (bool, error) {
		var err error
		a, err = c.GetAllocation(ctx, st.AllocationID)
		if err != nil {
			return false, err
		}
		return a.Status == "active" || a.Status == "failed", nil
	})
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("smoke test %s: allocation %s has no outcome after %s (release it with gpuaasctl alloc release)", st.ID, st.AllocationID, opts.Timeout)
	}
	if err != nil {
		return err
	}
	released := a.Status == "active"
	if released {
		if _, err := c.ReleaseAllocation(ctx, st.AllocationID); err != nil {
			return fmt.Errorf("smoke test booted; releasing allocation %s: %w", st.AllocationID, err)
		}
		// Until its disks are wiped and verified, the slot is not free for the next test or
		// allocation: wait for that too.
		err = cmdutil.Poll(wctx, 500*time.Millisecond, func(ctx context.Context) (bool, error) {
			var err error
			a, err = c.GetAllocation(ctx, st.AllocationID)
			return err == nil && a.Status == "released", err
		})
		if err != nil {
			return fmt.Errorf("smoke test booted; allocation %s not released yet: %w", st.AllocationID, err)
		}
	}
	tests, err := c.SmokeTests(ctx, st.Image)
	if err != nil {
		return err
	}
	for _, t := range tests {
		if t.ID != st.ID {
			continue
		}
		if err := printSmokeTests(opts.IO.Out, opts.Output, t, []apiv1.ImageSmokeTest{t}); err != nil {
			return err
		}
		if t.Status != "passed" {
			reason := t.FailureReason
			if strings.HasPrefix(t.GPUCheck, "failed") {
				reason = strings.TrimSpace("GPU check " + t.GPUCheck + " " + reason) // it booted, but its GPUs did not answer
			}
			return fmt.Errorf("smoke test %s of %s on %s failed: %s", t.ID, t.Image, t.Node, output.Dash(reason))
		}
		if released {
			fmt.Fprintf(opts.IO.ErrOut, "smoke test %s passed; allocation %s released (its disks wiped)\n", st.ID, st.AllocationID)
		}
		return nil
	}
	return fmt.Errorf("smoke test %s not found after it ran", st.ID)
}

// NewCmdTests is `images tests ID|SLUG`.
func NewCmdTests(f *cmdutil.Factory, runF func(*RefOptions) error) *cobra.Command {
	opts := &RefOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "tests ID|SLUG",
		Short: "List an image's smoke tests, newest first",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Image = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			tests, err := c.SmokeTests(cmd.Context(), opts.Image)
			if err != nil {
				return err
			}
			return printSmokeTests(opts.IO.Out, opts.Output, output.List(tests), tests)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// NewCmdActivate is `images activate ID|SLUG`.
func NewCmdActivate(f *cmdutil.Factory, runF func(*RefOptions) error) *cobra.Command {
	return newCmdRef(f, runF, "activate ID|SLUG", "Activate an image: needs a passed smoke test of its current digest",
		(*client.Client).ActivateImage)
}

func printRollout(w io.Writer, o output.Format, st *apiv1.ImageRolloutStatus) error {
	return output.Print(w, o, st, func(t *output.TableWriter) {
		t.Row("SKU:", st.SKU)
		t.Row("Default image:", output.Dash(st.DefaultImage))
		if st.Canary != nil {
			c := st.Canary
			t.Row("Canary:", fmt.Sprintf("%s on %d%% of nodes%s since %s (rollout %s)", c.Image, c.SharePercent,
				regionsNote(c.Regions), output.Time(c.StartedAt), c.ID))
		} else {
			t.Row("Canary:", "none")
		}
		for _, oc := range st.Outcomes {
			t.Row("Outcome:", fmt.Sprintf("%s: %d allocations, %d reached active, %d failed; ready in p50 %s, max %s",
				oc.Image, oc.Allocations, oc.Active, oc.Failed, output.Millis(oc.TimeToReadyP50MS), output.Millis(oc.TimeToReadyMaxMS)))
		}
		for _, h := range st.History {
			t.Row("History:", fmt.Sprintf("%s %s -> %s, %d%%%s, %s", output.Time(h.StartedAt), output.Dash(h.PreviousImage), h.Image,
				h.SharePercent, regionsNote(h.Regions), h.Status))
		}
	})
}

func regionsNote(r []string) string {
	if len(r) == 0 {
		return ""
	}
	return " and regions " + strings.Join(r, ",")
}

// RolloutOptions are the dependencies and flags of `images default` and `images rollout ...`.
type RolloutOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	SKU     string
	Image   string
	Share   int
	Regions []string
	Output  output.Format
}

// NewCmdDefault is `images default SKU ID|SLUG`.
func NewCmdDefault(f *cmdutil.Factory, runF func(*RolloutOptions) error) *cobra.Command {
	opts := &RolloutOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "default SKU ID|SLUG",
		Short: "Point a SKU's default image at a smoke-tested image directly (a SKU's first default; no canary)",
		Args:  cmdutil.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.SKU, opts.Image = args[0], args[1]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			st, err := c.SetDefaultImage(cmd.Context(), opts.SKU, opts.Image)
			if err != nil {
				return err
			}
			return printRollout(opts.IO.Out, opts.Output, st)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// NewCmdRollout is the `images rollout` group.
func NewCmdRollout(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "rollout", Short: "Canary a new default image on a SKU, then promote or roll back"}
	return cmdutil.Group(cmd, newCmdRolloutStart(f, nil), newCmdRolloutStatus(f, nil),
		newCmdRolloutFinish(f, nil, true), newCmdRolloutFinish(f, nil, false))
}

func newCmdRolloutStart(f *cmdutil.Factory, runF func(*RolloutOptions) error) *cobra.Command {
	opts := &RolloutOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "start SKU ID|SLUG --share PERCENT [--region R]...",
		Short: "Make a smoke-tested image the default on a share of the SKU's nodes (and named regions) first",
		Args:  cmdutil.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.SKU, opts.Image = args[0], args[1]
			if opts.Share < 0 || opts.Share > 100 {
				return cmdutil.FlagErrorf("--share must be 0..100")
			}
			if opts.Share == 0 && len(opts.Regions) == 0 {
				return cmdutil.FlagErrorf("give --share above 0 or at least one --region")
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			if _, err := c.StartRollout(cmd.Context(), opts.SKU, apiv1.ImageRolloutCreate{Image: opts.Image, SharePercent: opts.Share, Regions: opts.Regions}); err != nil {
				return err
			}
			st, err := c.ImageRolloutStatus(cmd.Context(), opts.SKU)
			if err != nil {
				return err
			}
			return printRollout(opts.IO.Out, opts.Output, st)
		},
	}
	cmd.Flags().IntVar(&opts.Share, "share", 0, "percent of the SKU's nodes that boot the canary image (0..100)")
	cmd.Flags().StringSliceVar(&opts.Regions, "region", nil, "region whose every node boots the canary image (repeatable)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func newCmdRolloutStatus(f *cmdutil.Factory, runF func(*RolloutOptions) error) *cobra.Command {
	opts := &RolloutOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "status SKU",
		Short: "Show a SKU's default image, its canary and how allocations on each fared (readiness failures, time to ready)",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.SKU = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			st, err := c.ImageRolloutStatus(cmd.Context(), opts.SKU)
			if err != nil {
				return err
			}
			return printRollout(opts.IO.Out, opts.Output, st)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func newCmdRolloutFinish(f *cmdutil.Factory, runF func(*RolloutOptions) error, promote bool) *cobra.Command {
	opts := &RolloutOptions{IO: f.IO, Client: f.Client}
	use, short := "rollback SKU", "End the canary (or move the default back from the last promotion); allocations keep their image"
	if promote {
		use, short = "promote SKU", "Make the canary image the SKU's default on every node"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.SKU = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			if promote {
				_, err = c.PromoteRollout(cmd.Context(), opts.SKU)
			} else {
				_, err = c.RollBackRollout(cmd.Context(), opts.SKU)
			}
			if err != nil {
				return err
			}
			st, err := c.ImageRolloutStatus(cmd.Context(), opts.SKU)
			if err != nil {
				return err
			}
			return printRollout(opts.IO.Out, opts.Output, st)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
