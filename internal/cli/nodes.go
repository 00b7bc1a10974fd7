package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
)

func ctxb() context.Context { return context.Background() }

// setup returns the configuration and the client for a command.
func setup(f *Factory) (Config, *client.Client, error) {
	cfg, err := f.Config()
	if err != nil {
		return cfg, nil, err
	}
	c, err := f.Client()
	return cfg, c, err
}

// NewCmdNodes is `gpuaasctl nodes`.
func NewCmdNodes(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "nodes", Short: "Register, inspect and drain GPU nodes (admin)"}
	cmd.AddCommand(newCmdNodesAdd(f), newCmdNodesList(f), newCmdNodesShow(f), newCmdNodesDrain(f, true), newCmdNodesDrain(f, false),
		newCmdNodesBootstrapToken(f), newCmdNodesStorageTransition(f))
	return cmd
}

func newCmdNodesAdd(f *Factory) *cobra.Command {
	var req apiv1.NodeCreate
	cmd := &cobra.Command{
		Use:   "add NAME --region R",
		Short: "Register a node",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			req.Name = args[0]
			if req.Region == "" {
				return &FlagError{Err: fmt.Errorf("--region is required")}
			}
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			n, err := c.CreateNode(ctxb(), req)
			if err != nil {
				return err
			}
			if err := printNodes(f, cfg.Output, n, []apiv1.Node{*n}); err != nil {
				return err
			}
			if cfg.Output == "table" && n.BootstrapToken != "" {
				fmt.Fprintf(f.IO.Out, "\nbootstrap token (one-time, expires %s):\n%s\n", n.BootstrapTokenExpiresAt.Format(time.RFC3339), n.BootstrapToken)
				fmt.Fprintln(f.IO.ErrOut, "enroll the host with: gpuaas-hostd enroll --server URL --ca-file CA --token TOKEN --config /etc/gpuaas/hostd.yaml")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&req.Region, "region", "", "region")
	fl.StringVar(&req.SKU, "sku", "", "baremetal SKU the node is sold as")
	fl.StringVar(&req.SliceSKU, "slice-sku", "", "slice SKU its approved slots sell")
	fl.StringVar(&req.TenantID, "tenant", "", "dedicate the node to one tenant")
	fl.StringArrayVar(&req.ProfileTags, "profile-tag", nil, "MAAS profile tag (repeatable), e.g. gpuaas-profile-slice-vm")
	fl.StringArrayVar(&req.HardwareTags, "hardware-tag", nil, "hardware tag (repeatable), e.g. gpu-nvidia-h200")
	return cmd
}

func printNodes(f *Factory, format string, v any, nodes []apiv1.Node) error {
	return render(f.IO.Out, format, v, func(t *tabwriter.Writer) {
		row(t, "NAME", "REGION", "STATUS", "MODE", "SLOTS", "AVAILABLE", "CLAIMS", "SKU", "SLICE SKU")
		for _, n := range nodes {
			row(t, n.Name, n.Region, n.Status, n.Mode, n.SlotSummary.Total, n.SlotSummary.ByStatus["available"],
				n.SlotSummary.LiveSlotClaims+n.SlotSummary.LiveExclusiveClaims, dash(n.SKU), dash(n.SliceSKU))
		}
	})
}

func newCmdNodesList(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List nodes with mode and slot counts",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			nodes, err := c.ListNodes(ctxb())
			if err != nil {
				return err
			}
			return printNodes(f, cfg.Output, apiv1.List[apiv1.Node]{Items: nodes}, nodes)
		},
	}
}

func newCmdNodesShow(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "show NODE",
		Short: "Show a node and why it is or is not schedulable",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			n, err := c.GetNode(ctxb(), args[0])
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, n, func(t *tabwriter.Writer) {
				row(t, "Name:", n.Name+" ("+n.ID+")")
				row(t, "Region:", n.Region)
				row(t, "Status:", n.Status)
				row(t, "Draining:", n.Draining)
				row(t, "Mode:", n.Mode)
				row(t, "SKU / slice SKU:", dash(n.SKU)+" / "+dash(n.SliceSKU))
				row(t, "Profile tags:", dash(strings.Join(n.ProfileTags, ",")))
				row(t, "Hardware tags:", dash(strings.Join(n.HardwareTags, ",")))
				hb := "never"
				if n.LastHeartbeatAt != nil {
					hb = n.LastHeartbeatAt.Format("2006-01-02 15:04:05 MST")
				}
				row(t, "Agent heartbeat:", hb)
				row(t, "Schedulable:", fmt.Sprintf("baremetal=%v slice=%v", n.Schedulable.Baremetal, n.Schedulable.Slice))
				sup := "yes"
				if !n.Schedulable.SliceSupported {
					sup = "no, missing: " + strings.Join(n.Schedulable.SliceMissing, ", ")
				}
				row(t, "Slice supported:", sup)
				for _, r := range n.Schedulable.Reasons {
					row(t, "", "- "+r)
				}
				var st []string
				for k, v := range n.SlotSummary.ByStatus {
					st = append(st, fmt.Sprintf("%s=%d", k, v))
				}
				sort.Strings(st)
				row(t, "Slots:", fmt.Sprintf("%d total: %s", n.SlotSummary.Total, dash(strings.Join(st, " "))))
				for _, s := range n.SlotSummary.BySKU {
					row(t, "", fmt.Sprintf("%s: %d available", s.SKU, s.Available))
				}
				row(t, "Live claims:", fmt.Sprintf("slot=%d node_exclusive=%d", n.SlotSummary.LiveSlotClaims, n.SlotSummary.LiveExclusiveClaims))
			})
		},
	}
}

func newCmdNodesDrain(f *Factory, drain bool) *cobra.Command {
	use, short := "undrain NODE", "Allow new placements on a node again"
	if drain {
		use, short = "drain NODE", "Stop new placements on a node (live allocations continue)"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			n, err := c.SetDraining(ctxb(), args[0], drain)
			if err != nil {
				return err
			}
			return printNodes(f, cfg.Output, n, []apiv1.Node{*n})
		},
	}
}

// NewCmdSlots is `gpuaasctl slots`.
func NewCmdSlots(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "slots", Short: "Inspect and approve a node's slot map (admin)"}
	cmd.AddCommand(newCmdSlotsList(f), newCmdSlotsApply(f), newCmdSlotsEnable(f, false), newCmdSlotsEnable(f, true), newCmdSlotsApprove(f), newCmdSlotsWipe(f))
	return cmd
}

func printSlots(f *Factory, format string, v any, slots []apiv1.Slot) error {
	return render(f.IO.Out, format, v, func(t *tabwriter.Writer) {
		row(t, "INDEX", "STATUS", "NUMA", "GPU PCI", "NVME", "FABRIC VF", "MAC", "IP", "ALLOCATION")
		for _, s := range slots {
			var md map[string]any
			_ = json.Unmarshal(s.CapacityMetadata, &md)
			vf, _ := md["fabric_vf_pci_address"].(string)
			row(t, s.SlotIndex, s.Status, intp(s.NUMANode), s.PCIAddress, s.NVMeDevice, dash(vf), s.MACAddress, s.PrivateIP, dash(s.AllocationID))
		}
	})
}

func newCmdSlotsList(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "list NODE",
		Short: "List a node's slots",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			slots, err := c.ListSlots(ctxb(), args[0])
			if err != nil {
				return err
			}
			return printSlots(f, cfg.Output, apiv1.List[apiv1.Slot]{Items: slots}, slots)
		},
	}
}

// readSlotMap reads a YAML or JSON slot map: a list of slots, or {slots: [...]}.
func readSlotMap(path string) ([]apiv1.SlotSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &FlagError{Err: fmt.Errorf("-f: %w", err)}
	}
	var generic any
	if err := yaml.Unmarshal(b, &generic); err != nil { // YAML is a superset of JSON
		return nil, &FlagError{Err: fmt.Errorf("%s: %w", path, err)}
	}
	if m, ok := generic.(map[string]any); ok {
		generic = m["slots"]
	}
	j, err := json.Marshal(generic)
	if err != nil {
		return nil, &FlagError{Err: fmt.Errorf("%s: %w", path, err)}
	}
	var specs []apiv1.SlotSpec
	dec := json.NewDecoder(strings.NewReader(string(j)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&specs); err != nil {
		return nil, &FlagError{Err: fmt.Errorf("%s: not a slot map: %w", path, err)}
	}
	if len(specs) == 0 {
		return nil, &FlagError{Err: fmt.Errorf("%s holds no slots", path)}
	}
	return specs, nil
}

func newCmdSlotsApply(f *Factory) *cobra.Command {
	var file string
	var dry bool
	cmd := &cobra.Command{
		Use:   "apply NODE -f FILE",
		Short: "Apply a declarative slot map (shows the diff; --dry-run changes nothing)",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if file == "" {
				return &FlagError{Err: fmt.Errorf("-f FILE is required")}
			}
			specs, err := readSlotMap(file)
			if err != nil {
				return err
			}
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			res, err := c.ApplySlots(ctxb(), args[0], apiv1.SlotApply{Slots: specs, DryRun: dry})
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, res, func(t *tabwriter.Writer) {
				row(t, "SLOT", "ACTION", "FIELDS")
				for _, ch := range res.Changes {
					row(t, ch.SlotIndex, ch.Action, dash(strings.Join(ch.Fields, ",")))
				}
				if res.Applied {
					row(t, "applied")
				} else {
					row(t, "dry run: nothing changed")
				}
			})
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "slot map (YAML or JSON)")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "show the diff only")
	return cmd
}

func newCmdSlotsEnable(f *Factory, enable bool) *cobra.Command {
	use, short := "disable NODE INDEX", "Take a slot out of service"
	if enable {
		use, short = "enable NODE INDEX", "Return a disabled slot to service"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			idx, err := strconv.Atoi(args[1])
			if err != nil || idx < 0 {
				return &FlagError{Err: fmt.Errorf("INDEX must be a non-negative integer")}
			}
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			s, err := c.SetSlotEnabled(ctxb(), args[0], idx, enable)
			if err != nil {
				return err
			}
			return printSlots(f, cfg.Output, s, []apiv1.Slot{*s})
		},
	}
}

func newCmdNodesBootstrapToken(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "bootstrap-token NODE",
		Short: "Issue a new one-time enrollment token for a node's host daemon",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			bt, err := c.NewBootstrapToken(ctxb(), args[0])
			if err != nil {
				return err
			}
			if cfg.Output == "table" {
				fmt.Fprintln(f.IO.Out, bt.Token)
				fmt.Fprintf(f.IO.ErrOut, "one-time token for node %s, expires %s\n", bt.NodeID, bt.ExpiresAt.Format(time.RFC3339))
				return nil
			}
			return render(f.IO.Out, cfg.Output, bt, nil)
		},
	}
}

// waitTask polls a task until it is final and prints its output.
func waitTask(f *Factory, id string) error {
	c, err := f.Client()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Hour)
	for time.Now().Before(deadline) {
		tk, err := c.GetTask(ctxb(), id)
		if err != nil {
			return err
		}
		switch tk.Status {
		case "succeeded", "failed", "refused", "expired":
			fmt.Fprintf(f.IO.Out, "task %s %s\n%s\n", tk.ID, tk.Status, tk.Output)
			if tk.Status != "succeeded" {
				return fmt.Errorf("task %s: %s", tk.Status, tk.Error)
			}
			return nil
		}
		time.Sleep(500 * time.Millisecond) // status poll interval
	}
	return fmt.Errorf("task %s did not finish", id)
}

func newCmdNodesStorageTransition(f *Factory) *cobra.Command {
	var req apiv1.StorageTransitionRequest
	var wait bool
	cmd := &cobra.Command{
		Use:   "storage-transition NODE --devices DEV,... [--apply --confirm NODE] [--wait]",
		Short: "Hand a node's raw NVMe from host/share use to slice ownership (dry run unless --apply)",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if len(req.Devices) == 0 {
				return &FlagError{Err: fmt.Errorf("--devices is required")}
			}
			if req.Apply && req.Confirm != args[0] {
				return &FlagError{Err: fmt.Errorf("--apply destroys data: confirm with --confirm %s", args[0])}
			}
			_, c, err := setup(f)
			if err != nil {
				return err
			}
			id, err := c.StorageTransition(ctxb(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprintf(f.IO.ErrOut, "queued task %s\n", id)
			if wait {
				return waitTask(f, id)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&req.Devices, "devices", nil, "raw devices (/dev/disk/by-id/...)")
	cmd.Flags().BoolVar(&req.Apply, "apply", false, "perform it (default: plan only)")
	cmd.Flags().StringVar(&req.Confirm, "confirm", "", "the node name, required with --apply")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the host's report")
	return cmd
}

func newCmdSlotsWipe(f *Factory) *cobra.Command {
	var apply, wait bool
	cmd := &cobra.Command{
		Use:   "wipe NODE INDEX [--apply] [--wait]",
		Short: "Repair a cleanup_blocked slot: wipe its disk and verify (dry run unless --apply)",
		Args:  cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			idx, err := strconv.Atoi(args[1])
			if err != nil || idx < 0 {
				return &FlagError{Err: fmt.Errorf("INDEX must be a non-negative integer")}
			}
			_, c, err := setup(f)
			if err != nil {
				return err
			}
			id, err := c.WipeSlot(ctxb(), args[0], idx, apply)
			if err != nil {
				return err
			}
			fmt.Fprintf(f.IO.ErrOut, "queued task %s\n", id)
			if wait {
				return waitTask(f, id)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&apply, "apply", false, "perform the wipe")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the host's evidence")
	return cmd
}
