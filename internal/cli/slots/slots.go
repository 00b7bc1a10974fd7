// Package slots is `gpuaasctl slots`: a node's approved slot map (one GPU with its NUMA-local
// NVMe and fabric VF per slot, and its own host CPU set): list and show it, apply a reviewed map, approve discovered candidates,
// take slots out of service and repair them, quarantine and clear them (admin).
package slots

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

// NewCmdSlots is the `slots` command group.
func NewCmdSlots(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "slots", Short: "Inspect, apply and approve a node's slot map (admin)", Aliases: []string{"slot"}}
	return cmdutil.Group(cmd,
		NewCmdList(f, nil),
		NewCmdShow(f, nil),
		NewCmdApply(f, nil),
		NewCmdDisable(f, nil),
		NewCmdEnable(f, nil),
		NewCmdApprove(f, nil),
		NewCmdWipe(f, nil),
		NewCmdQuarantine(f, nil),
		NewCmdClear(f, nil),
		NewCmdValidate(f, nil),
	)
}

func printSlots(w io.Writer, o output.Format, v any, slots []apiv1.Slot) error {
	return output.Print(w, o, v, func(t *output.TableWriter) {
		t.Header("slots", len(slots), "INDEX", "STATUS", "HEALTH", "NUMA", "HOST CPUS", "VCPUS", "GPU PCI", "NVME", "FABRIC VF", "MAC", "IP", "ALLOCATION")
		for _, s := range slots {
			var md map[string]any
			_ = json.Unmarshal(s.CapacityMetadata, &md)
			vf, _ := md["fabric_vf_pci_address"].(string)
			t.Row(s.SlotIndex, s.Status, output.Dash(s.Health), output.IntPtr(s.NUMANode), output.Dash(s.HostCPUs), output.IntPtr(s.VCPUCount),
				output.Dash(s.PCIAddress), output.Dash(s.NVMeDevice), output.Dash(vf), output.Dash(s.MACAddress),
				output.Dash(s.PrivateIP), output.Dash(s.AllocationID))
		}
	})
}

// printChanges is the slot-map diff table of apply and approve.
func printChanges(w io.Writer, o output.Format, res *apiv1.SlotApplyResult, appliedWord string) error {
	return output.Print(w, o, res, func(t *output.TableWriter) {
		t.Row("SLOT", "ACTION", "HOST CPUS", "FIELDS")
		for _, ch := range res.Changes {
			fields := "-"
			if len(ch.Fields) > 0 {
				fields = strings.Join(ch.Fields, ",")
			}
			t.Row(ch.SlotIndex, ch.Action, output.Dash(ch.HostCPUs), fields)
		}
		t.Blank()
		t.Row("housekeeping CPUs: " + output.Dash(res.HousekeepingCPUs))
		if res.Applied {
			t.Row(appliedWord)
		} else {
			t.Row("dry run: nothing changed")
		}
	})
}

// parseIndex reads a slot index argument.
func parseIndex(s string) (int, error) {
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 {
		return 0, cmdutil.FlagErrorf("INDEX must be a non-negative integer, not %q", s)
	}
	return i, nil
}
