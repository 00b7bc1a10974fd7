package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// NewCmdTasks is `gpuaasctl tasks`: the signed node tasks behind allocations (admin).
func NewCmdTasks(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "tasks", Short: "Node tasks and their phase timings (admin)"}
	var node, allocation string
	list := &cobra.Command{
		Use:   "list [--node N] [--allocation ID]",
		Short: "List node tasks, newest first",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			items, err := c.ListTasks(ctxb(), node, allocation)
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, apiv1.List[apiv1.Task]{Items: items}, func(t *tabwriter.Writer) {
				row(t, "ID", "TYPE", "STATUS", "ATTEMPT", "PHASES", "TOTAL", "ALLOCATION", "CREATED")
				for _, tk := range items {
					row(t, tk.ID, tk.Type, tk.Status, tk.Attempt, len(tk.Phases), total(tk.Phases), dash(tk.AllocationID), tk.CreatedAt.Format("15:04:05"))
				}
			})
		},
	}
	list.Flags().StringVar(&node, "node", "", "only tasks of this node")
	list.Flags().StringVar(&allocation, "allocation", "", "only tasks of this allocation")
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show a task with its phase timings",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			tk, err := c.GetTask(ctxb(), args[0])
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, tk, func(t *tabwriter.Writer) {
				row(t, "Task:", tk.ID)
				row(t, "Type:", tk.Type)
				row(t, "Status:", tk.Status)
				row(t, "Attempt:", fmt.Sprintf("%d of %d", tk.Attempt, tk.MaxAttempts))
				row(t, "Node:", tk.NodeID)
				row(t, "Allocation:", dash(tk.AllocationID))
				if tk.Error != "" {
					row(t, "Error:", tk.Error)
				}
				if len(tk.Output) > 0 {
					row(t, "Output:", string(tk.Output))
				}
				row(t, "")
				row(t, "PHASE", "STATUS", "DURATION", "ERROR")
				for _, p := range tk.Phases {
					row(t, p.Name, p.Status, (time.Duration(p.DurationMS) * time.Millisecond).String(), dash(p.Error))
				}
				row(t, "total", "", total(tk.Phases), "")
			})
		},
	}
	cmd.AddCommand(list, show)
	return cmd
}

func total(ph []apiv1.TaskPhase) string {
	var ms int64
	for _, p := range ph {
		ms += p.DurationMS
	}
	return (time.Duration(ms) * time.Millisecond).String()
}
