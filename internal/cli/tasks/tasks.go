// Package tasks is `gpuaasctl tasks`: the signed node tasks behind allocations, discovery and
// repairs, with their phase timings (admin). Wait is shared by commands that queue a task.
package tasks

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

// NewCmdTasks is the `tasks` command group.
func NewCmdTasks(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "tasks", Short: "Node tasks and their phase timings (admin)"}
	return cmdutil.Group(cmd, NewCmdList(f, nil), NewCmdShow(f, nil), NewCmdLogs(f))
}

// ListOptions are `tasks list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node       string
	Allocation string
	Output     output.Format
}

// NewCmdList is `tasks list`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "list [--node NODE] [--allocation ID]",
		Short:   "List node tasks, newest first",
		Aliases: []string{"ls"},
		Args:    cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			items, err := c.ListTasks(cmd.Context(), opts.Node, opts.Allocation)
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, output.List(items), func(t *output.TableWriter) {
				t.Header("tasks", len(items), "ID", "TYPE", "STATUS", "ATTEMPT", "PHASES", "TOTAL", "ALLOCATION", "CREATED")
				for _, tk := range items {
					t.Row(tk.ID, tk.Type, tk.Status, tk.Attempt, len(tk.Phases), total(tk.Phases), output.Dash(tk.AllocationID), output.Time(tk.CreatedAt))
				}
			})
		},
	}
	cmd.Flags().StringVar(&opts.Node, "node", "", "only tasks of this node")
	cmd.Flags().StringVar(&opts.Allocation, "allocation", "", "only tasks of this allocation")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// ShowOptions are `tasks show`'s dependencies and flags.
type ShowOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID     string
	Output output.Format
}

// NewCmdShow is `tasks show ID`.
func NewCmdShow(f *cmdutil.Factory, runF func(*ShowOptions) error) *cobra.Command {
	opts := &ShowOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a task with its phase timings",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			if opts.ID, err = cmdutil.TaskID(cmd.Context(), c, opts.ID); err != nil {
				return err
			}
			tk, err := c.GetTask(cmd.Context(), opts.ID)
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, tk, func(t *output.TableWriter) { printTask(t, tk) })
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func printTask(t *output.TableWriter, tk *apiv1.Task) {
	t.Row("Task:", tk.ID)
	t.Row("Type:", tk.Type)
	t.Row("Status:", tk.Status)
	t.Row("Attempt:", fmt.Sprintf("%d of %d", tk.Attempt, tk.MaxAttempts))
	t.Row("Node:", tk.NodeID)
	t.Row("Allocation:", output.Dash(tk.AllocationID))
	t.Row("Created:", output.Time(tk.CreatedAt))
	t.Row("Completed:", output.TimePtr(tk.CompletedAt))
	if tk.Error != "" {
		t.Row("Error:", tk.Error)
	}
	if len(tk.Output) > 0 {
		t.Row("Output:", string(tk.Output))
	}
	t.Blank()
	t.Row("PHASE", "STATUS", "DURATION", "WATERFALL", "DETAIL")
	bars := Waterfall(tk.Phases, 30)
	for i, p := range tk.Phases {
		t.Row(p.Name, p.Status, output.Millis(p.DurationMS), bars[i], output.Dash(p.Note()))
	}
	t.Row("total", "", total(tk.Phases))
}

func total(ph []apiv1.TaskPhase) string {
	var ms int64
	for _, p := range ph {
		ms += p.DurationMS
	}
	return output.Millis(ms)
}

// Wait polls task id until it is final, then writes its status and output to out. A task
// that did not succeed is an error.
func Wait(ctx context.Context, out io.Writer, c *client.Client, id string, timeout time.Duration) error {
	tk, err := WaitTask(ctx, c, id, timeout)
	if tk != nil && err == nil {
		fmt.Fprintf(out, "task %s %s\n%s\n", tk.ID, tk.Status, tk.Output)
	}
	return err
}

// WaitTask polls a task until it ends and returns it; a task that did not succeed is an
// error (the task is still returned, with its output).
func WaitTask(ctx context.Context, c *client.Client, id string, timeout time.Duration) (*apiv1.Task, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var tk *apiv1.Task
	err := cmdutil.Poll(ctx, 500*time.Millisecond, func(ctx context.Context) (bool, error) {
		var err error
		tk, err = c.GetTask(ctx, id)
		if err != nil {
			return false, err
		}
		switch tk.Status {
		case "succeeded", "failed", "refused", "expired":
			return true, nil
		}
		return false, nil
	})
	if errors.Is(err, context.DeadlineExceeded) && tk != nil {
		return tk, fmt.Errorf("task %s is still %s after %s (is the host daemon running?)", id, tk.Status, timeout)
	}
	if err != nil {
		return tk, err
	}
	if tk.Status != "succeeded" {
		return tk, fmt.Errorf("task %s %s: %s", tk.ID, tk.Status, output.Dash(tk.Error))
	}
	return tk, nil
}

// Waterfall draws each phase as a bar on a shared time axis `width` cells wide: where it
// started relative to the first phase, and for how long. A phase too short for a cell still
// gets a thin mark, so every phase is visible.
func Waterfall(ph []apiv1.TaskPhase, width int) []string {
	out := make([]string, len(ph))
	if len(ph) == 0 {
		return out
	}
	start, end := ph[0].StartedAt, ph[0].StartedAt
	for _, p := range ph {
		if p.StartedAt.Before(start) {
			start = p.StartedAt
		}
		if e := p.StartedAt.Add(time.Duration(p.DurationMS) * time.Millisecond); e.After(end) {
			end = e
		}
	}
	span := end.Sub(start)
	for i, p := range ph {
		if span <= 0 {
			out[i] = "▏"
			continue
		}
		off := int(float64(p.StartedAt.Sub(start)) / float64(span) * float64(width))
		n := int(float64(time.Duration(p.DurationMS)*time.Millisecond) / float64(span) * float64(width))
		if off >= width {
			off = width - 1
		}
		if off+n > width {
			n = width - off
		}
		bar := strings.Repeat("█", n)
		if n == 0 {
			bar = "▏"
		}
		out[i] = strings.Repeat(" ", off) + bar
	}
	return out
}

// NewCmdLogs is `tasks logs ID [--follow]`.
func NewCmdLogs(f *cmdutil.Factory) *cobra.Command {
	follow := false
	timeout := 2 * time.Hour
	cmd := &cobra.Command{
		Use:   "logs ID [--follow]",
		Short: "Print a task's phases, one line each; --follow prints new ones until the task ends",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.Client()
			if err != nil {
				return err
			}
			id, err := cmdutil.TaskID(cmd.Context(), c, args[0])
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			printed := 0
			var tk *apiv1.Task
			err = cmdutil.Poll(ctx, 500*time.Millisecond, func(ctx context.Context) (bool, error) {
				if tk, err = c.GetTask(ctx, id); err != nil {
					return false, err
				}
				for ; printed < len(tk.Phases); printed++ {
					p := tk.Phases[printed]
					if p.Status == "running" {
						break // in flight: printed once it finishes
					}
					fmt.Fprintf(f.IO.Out, "%s %-26s %-8s %8s  %s\n", p.StartedAt.UTC().Format("15:04:05.000Z"), p.Name, p.Status, output.Millis(p.DurationMS), p.Note())
				}
				ended := tk.Status != "queued" && tk.Status != "leased"
				return !follow || ended, nil
			})
			if err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("task %s still %s after %s", args[0], tk.Status, timeout)
				}
				return err
			}
			if tk.Status != "queued" && tk.Status != "leased" {
				fmt.Fprintf(f.IO.ErrOut, "task %s %s%s\n", output.Short(tk.ID), tk.Status, map[bool]string{true: ": " + tk.Error, false: ""}[tk.Error != ""])
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing phases until the task ends")
	cmd.Flags().DurationVar(&timeout, "timeout", timeout, "with --follow: give up after this long")
	return cmd
}
