// Package dashboardcmd is `gpuaasctl dashboard`, the live fleet screen (internal/tui/dashboard).
package dashboardcmd

import (
	"context"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/tui/dashboard"
)

// NewCmdDashboard is `dashboard [--interval 2s]`.
func NewCmdDashboard(f *cmdutil.Factory) *cobra.Command {
	every := 2 * time.Second
	cmd := &cobra.Command{
		Use:   "dashboard [--interval 2s]",
		Short: "Live fleet screen: nodes, modes, slot occupancy per NUMA group, tasks in flight (admin)",
		Args:  cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !f.IO.Interactive() {
				return cmdutil.FlagErrorf("dashboard needs a terminal; for scripts use `nodes list --watch` or `tasks list -o json`")
			}
			if every < 500*time.Millisecond {
				return cmdutil.FlagErrorf("--interval must be at least 500ms")
			}
			c, err := f.Client()
			if err != nil {
				return err
			}
			m := dashboard.New(Fetch(c), every, nil)
			_, err = tea.NewProgram(m, tea.WithContext(cmd.Context()), tea.WithInput(f.IO.In), tea.WithOutput(f.IO.Out), tea.WithAltScreen()).Run()
			return err
		},
	}
	cmd.Flags().DurationVar(&every, "interval", every, "refresh interval")
	return cmd
}

// Fetch loads a dashboard snapshot through the API: all nodes, the highlighted node's slots,
// and the queued or running tasks among the newest.
func Fetch(c *client.Client) dashboard.FetchFunc {
	return func(ctx context.Context, node string) (dashboard.Snapshot, error) {
		s := dashboard.Snapshot{At: time.Now()}
		var err error
		if s.Nodes, err = c.ListNodes(ctx); err != nil {
			return s, err
		}
		if node == "" && len(s.Nodes) > 0 {
			node = s.Nodes[0].Name
			for _, n := range s.Nodes {
				if n.Name < node {
					node = n.Name
				}
			}
		}
		if node != "" {
			if s.Slots, err = c.ListSlots(ctx, node); err != nil {
				return s, err
			}
		}
		tasks, err := c.ListTasks(ctx, "", "")
		if err != nil {
			return s, err
		}
		for _, t := range tasks {
			if t.Status == "queued" || t.Status == "leased" {
				s.Tasks = append(s.Tasks, t)
			}
		}
		return s, nil
	}
}
