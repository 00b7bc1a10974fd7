// Package storage is `gpuaasctl storage transition`: hand a node's raw NVMe from host use
// (the baremetal share layout) to slice ownership. It always shows the host's plan first; with
// --apply the operator types the node name (or passes --yes), then each device's result is
// shown as the host reports it.
package storage

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/cli/tasks"
	"github.com/gpuaas/gpuaas/internal/client"
)

// Options are `storage transition`'s dependencies and flags.
type Options struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node    string
	Devices []string
	Apply   bool
	Yes     bool
	Confirm string
	Timeout time.Duration
	Output  output.Format
}

// NewCmdStorage is the `storage` command group.
func NewCmdStorage(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "storage", Short: "Hand a node's raw NVMe to slice ownership (admin)"}
	return cmdutil.Group(cmd, NewCmdTransition(f, nil))
}

// NewCmdTransition is `storage transition NODE --devices DEV,... [--apply [--yes]]`.
func NewCmdTransition(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "transition NODE --devices DEV,... [--apply [--yes]]",
		Short: "Plan (default) or apply the hand-over of raw NVMe from host use to slice ownership",
		Long: `The node's host daemon plans the transition of each device: unmount, remove its fstab
lines (backed up), wipe signatures; it refuses the OS disk and anything it cannot prove safe.
Without --apply only the plan is shown. With --apply the plan is shown first, then you type
the node's name to confirm (--yes skips the prompt, for scripts), then each device's result.`,
		Example: `  gpuaasctl storage transition h200-01 --devices /dev/disk/by-id/nvme-eui.0025388b01000001
  gpuaasctl storage transition h200-01 --devices /dev/disk/by-id/nvme-a,/dev/disk/by-id/nvme-b --apply`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if len(opts.Devices) == 0 {
				return cmdutil.FlagErrorf("--devices is required")
			}
			if opts.Confirm != "" && opts.Confirm != opts.Node {
				return cmdutil.FlagErrorf("--confirm %q does not match the node %q", opts.Confirm, opts.Node)
			}
			if opts.Apply && !opts.Yes && opts.Confirm == "" && !opts.IO.Interactive() {
				return cmdutil.FlagErrorf("--apply destroys data on a non-interactive terminal only with --yes (or --confirm %s)", opts.Node)
			}
			if runF != nil {
				return runF(opts)
			}
			return run(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&opts.Devices, "devices", nil, "raw devices (/dev/disk/by-id/...), comma separated")
	fl.BoolVar(&opts.Apply, "apply", false, "perform it after showing the plan (default: plan only)")
	fl.BoolVar(&opts.Yes, "yes", false, "with --apply: do not ask for the node name")
	fl.StringVar(&opts.Confirm, "confirm", "", "with --apply: the node name, instead of typing it")
	fl.DurationVar(&opts.Timeout, "timeout", 2*time.Hour, "give up waiting for the host after this long")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// result is the host's report (disk.TransitionResult's JSON).
type result struct {
	Node    string `json:"node"`
	Applied bool   `json:"applied"`
	Devices []struct {
		Device     string   `json:"device"`
		Resolved   string   `json:"resolved"`
		Mounts     []mount  `json:"mounts"`
		FstabLines []string `json:"fstab_lines"`
		Actions    []string `json:"actions"`
		Refused    string   `json:"refused"`
		Evidence   *struct {
			Verified bool   `json:"verified"`
			Method   string `json:"method"`
			Error    string `json:"error"`
		} `json:"evidence"`
	} `json:"devices"`
	FstabBackup string `json:"fstab_backup"`
	Manifest    string `json:"manifest"`
}

type mount struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

func (o *Options) call(ctx context.Context, c *client.Client, apply bool) (*result, *apiv1.Task, error) {
	req := apiv1.StorageTransitionRequest{Devices: o.Devices, Apply: apply}
	if apply {
		req.Confirm = o.Node
	}
	id, err := c.StorageTransition(ctx, o.Node, req)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(o.IO.ErrOut, "%s task %s queued on %s; waiting for the host…\n", map[bool]string{true: "apply", false: "plan"}[apply], output.Short(id), o.Node)
	tk, werr := tasks.WaitTask(ctx, c, id, o.Timeout)
	if tk == nil || len(tk.Output) == 0 {
		return nil, tk, werr
	}
	var r result
	if err := json.Unmarshal(tk.Output, &r); err != nil {
		return nil, tk, fmt.Errorf("host report: %w", err)
	}
	return &r, tk, werr
}

func run(ctx context.Context, o *Options) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	plan, tk, err := o.call(ctx, c, false)
	if plan != nil {
		if perr := printResult(o.IO.Out, o.Output, plan, tk); perr != nil {
			return perr
		}
	}
	if err != nil || !o.Apply {
		return err
	}
	for _, d := range plan.Devices {
		if d.Refused != "" {
			return fmt.Errorf("not applying: the host refuses %s (%s)", d.Device, d.Refused)
		}
	}
	if !o.Yes && o.Confirm == "" {
		fmt.Fprintf(o.IO.ErrOut, "\nThis erases the listed devices on %s. Type the node name to apply: ", o.Node)
		line, _ := bufio.NewReader(o.IO.In).ReadString('\n')
		if strings.TrimSpace(line) != o.Node {
			fmt.Fprintln(o.IO.ErrOut, "not applied: the name does not match")
			return &cmdutil.SilentError{Code: 1}
		}
	}
	res, tk, err := o.call(ctx, c, true)
	if res != nil {
		if perr := printResult(o.IO.Out, o.Output, res, tk); perr != nil {
			return perr
		}
	}
	return err
}

func printResult(w io.Writer, f output.Format, r *result, tk *apiv1.Task) error {
	return output.Print(w, f, r, func(t *output.TableWriter) {
		t.Row("DEVICE", "RESOLVED", "MOUNTS", "ACTIONS", "RESULT")
		for _, d := range r.Devices {
			var ms []string
			for _, m := range d.Mounts {
				ms = append(ms, m.Source+" on "+m.Target)
			}
			res := "planned"
			switch {
			case d.Refused != "":
				res = "refused: " + d.Refused
			case r.Applied && d.Evidence != nil && d.Evidence.Error != "":
				res = "failed: " + d.Evidence.Error
			case r.Applied:
				res = "done"
			}
			t.Row(d.Device, output.Dash(d.Resolved), output.Dash(strings.Join(ms, ", ")), output.Dash(strings.Join(d.Actions, "; ")), res)
		}
		t.Blank()
		if r.Applied {
			t.Row("applied on " + r.Node + "; fstab backup " + output.Dash(r.FstabBackup) + "; manifest " + output.Dash(r.Manifest))
		} else {
			t.Row("plan only: nothing changed (task " + output.Short(tk.ID) + ")")
		}
	})
}
