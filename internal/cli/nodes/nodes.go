// Package nodes is `gpuaasctl nodes`: register GPU nodes, inspect their mode and why they are
// or are not schedulable, drain them, and hand their storage to slice use (admin).
package nodes

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

// NewCmdNodes is the `nodes` command group.
func NewCmdNodes(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "nodes", Short: "Register, inspect and drain GPU nodes (admin)", Aliases: []string{"node"}}
	return cmdutil.Group(cmd,
		NewCmdAdd(f, nil),
		NewCmdList(f, nil),
		NewCmdShow(f, nil),
		NewCmdDrain(f, nil),
		NewCmdUndrain(f, nil),
		NewCmdMaintenance(f, nil),
		NewCmdBootstrapToken(f, nil),
		NewCmdRevoke(f, nil),
		NewCmdStorageTransition(f, nil),
		NewCmdReconcile(f, nil),
		NewCmdCloudInit(f),
	)
}

// printList writes v as JSON/YAML, or the nodes as a table.
func printList(w io.Writer, o output.Format, v any, nodes []apiv1.Node) error {
	return output.Print(w, o, v, func(t *output.TableWriter) {
		t.Header("nodes", len(nodes), "NAME", "REGION", "STATUS", "MODE", "SLOTS", "AVAILABLE", "CLAIMS", "SKU", "SLICE SKU", "SIMULATED")
		for _, n := range nodes {
			s := n.SlotSummary
			t.Row(n.Name, n.Region, n.Status, n.Mode, s.Total, s.ByStatus["available"],
				s.LiveSlotClaims+s.LiveExclusiveClaims, output.Dash(n.SKU), output.Dash(n.SliceSKU), simulatedMark(n.Simulated))
		}
	})
}

// simulatedMark is the SIMULATED column: a node whose hostd runs the sim runtime (no VMs, no
// disk writes) says so in capitals; a real one shows a dash.
func simulatedMark(sim bool) string {
	if sim {
		return "SIMULATED"
	}
	return "-"
}
