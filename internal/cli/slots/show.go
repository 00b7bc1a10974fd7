package slots

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ShowOptions are `slots show`'s dependencies and flags.
type ShowOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node   string
	Index  int
	Output output.Format
}

// NewCmdShow is `slots show NODE INDEX`.
func NewCmdShow(f *cmdutil.Factory, runF func(*ShowOptions) error) *cobra.Command {
	opts := &ShowOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "show NODE INDEX",
		Short: "Show one slot: its devices, NUMA node, host CPU set, status, allocation, health and validations",
		Args:  cmdutil.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			idx, err := parseIndex(args[1])
			if err != nil {
				return err
			}
			opts.Index = idx
			if runF != nil {
				return runF(opts)
			}
			return showRun(cmd.Context(), opts)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func showRun(ctx context.Context, opts *ShowOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	slots, err := c.ListSlots(ctx, opts.Node)
	if err != nil {
		return err
	}
	for _, s := range slots {
		if s.SlotIndex == opts.Index {
			h, err := c.SlotHealth(ctx, opts.Node, opts.Index)
			if err != nil {
				return err
			}
			return printSlot(opts.IO.Out, opts.Output, s, h)
		}
	}
	return fmt.Errorf("node %s has no slot %d", opts.Node, opts.Index)
}

// printSlot is one slot, a field a line, with its health; as JSON or YAML, the slot's fields
// with its health events and validations beside them.
func printSlot(w io.Writer, o output.Format, s apiv1.Slot, h *apiv1.SlotHealth) error {
	v := struct {
		apiv1.Slot
		HealthEvents []apiv1.HealthEvent    `json:"health_events"`
		Validations  []apiv1.SlotValidation `json:"validations"`
	}{s, h.Events, h.Validations}
	return output.Print(w, o, v, func(t *output.TableWriter) {
		var md map[string]any
		_ = json.Unmarshal(s.CapacityMetadata, &md)
		vf, _ := md["fabric_vf_pci_address"].(string)
		wipe, _ := md["destructive_wipe_policy"].(string)
		status := s.Status
		if s.StatusReason != "" {
			status += " (" + s.StatusReason + ")"
		}
		t.Row("Slot:", fmt.Sprintf("%d (%s)", s.SlotIndex, s.ID))
		t.Row("Status:", status)
		t.Row("NUMA node:", output.IntPtr(s.NUMANode))
		t.Row("Host CPUs:", output.Dash(s.HostCPUs))
		t.Row("vCPUs:", output.IntPtr(s.VCPUCount))
		t.Row("Memory MiB:", output.IntPtr(s.MemoryMiB))
		t.Row("GPU:", output.Dash(s.PCIAddress)+" "+output.Dash(s.GPUModel))
		t.Row("NVMe:", output.Dash(s.NVMeDevice))
		t.Row("Wipe policy:", output.Dash(wipe))
		t.Row("Fabric:", output.Dash(s.NetworkFabric)+" PF "+output.Dash(s.FabricPCIAddress)+" VF "+output.Dash(vf))
		t.Row("MAC / IP:", output.Dash(s.MACAddress)+" "+output.Dash(s.PrivateIP))
		t.Row("Allocation:", output.Dash(s.AllocationID))
		printHealth(t, h)
	})
}
