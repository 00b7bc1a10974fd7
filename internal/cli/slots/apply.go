package slots

import (
	"context"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// ApplyOptions are `slots apply`'s dependencies and flags.
type ApplyOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node   string
	File   string
	DryRun bool
	Output output.Format
}

// NewCmdApply is `slots apply NODE -f FILE`.
func NewCmdApply(f *cmdutil.Factory, runF func(*ApplyOptions) error) *cobra.Command {
	opts := &ApplyOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "apply NODE -f FILE [--dry-run]",
		Short: "Apply a declarative slot map and show the diff (--dry-run changes nothing)",
		Long: `Apply a declarative slot map (a reviewed site topology profile) to a node and show the
diff. FILE is YAML or JSON: a list of slots, or {slots: [...]}, with the API's field names
(slot_index, pci_address, nvme_device, numa_node, mac_address, private_ip, ...). Unknown keys
are refused. Slots the map leaves out are disabled. "-" reads the map from standard input.`,
		Example: `  gpuaasctl slots apply h200-01 -f h200-01-slots.yaml --dry-run
  gpuaasctl slots apply h200-01 -f h200-01-slots.yaml`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			if opts.File == "" {
				return cmdutil.FlagErrorf("-f FILE is required")
			}
			if runF != nil {
				return runF(opts)
			}
			return applyRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVarP(&opts.File, "file", "f", "", "slot map, YAML or JSON (- for standard input)")
	cmd.Flags().BoolVar(&opts.DryRun, "dry-run", false, "show the diff only; change nothing")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func applyRun(ctx context.Context, opts *ApplyOptions) error {
	specs, err := ReadSlotMap(opts.IO.In, opts.File)
	if err != nil {
		return err
	}
	c, err := opts.Client()
	if err != nil {
		return err
	}
	res, err := c.ApplySlots(ctx, opts.Node, apiv1.SlotApply{Slots: specs, DryRun: opts.DryRun})
	if err != nil {
		return err
	}
	return printChanges(opts.IO.Out, opts.Output, res, "applied")
}

// ReadSlotMap reads a YAML or JSON slot map: a list of slots, or a document whose only key
// is slots. Unknown fields and an empty map are refused.
func ReadSlotMap(in io.Reader, path string) ([]apiv1.SlotSpec, error) {
	doc, err := cmdutil.ReadYAMLOrJSON(in, path)
	if err != nil {
		return nil, err
	}
	if m, ok := doc.(map[string]any); ok {
		var other []string
		for k := range m {
			if k != "slots" {
				other = append(other, k)
			}
		}
		if len(other) > 0 {
			sort.Strings(other)
			return nil, cmdutil.InputErrorf("%s: unknown top-level key(s) %s: want a list of slots or {slots: [...]}", path, cmdutil.KeyNames(other))
		}
		doc = m["slots"]
	}
	if _, ok := doc.([]any); !ok {
		return nil, cmdutil.InputErrorf("%s: not a slot map: want a list of slots or {slots: [...]}", path)
	}
	var specs []apiv1.SlotSpec
	if err := cmdutil.DecodeStrict(doc, &specs, path); err != nil {
		return nil, err
	}
	if len(specs) == 0 {
		return nil, cmdutil.FlagErrorf("%s holds no slots", path)
	}
	seen := map[int]bool{}
	for _, s := range specs {
		if seen[s.SlotIndex] {
			return nil, cmdutil.FlagErrorf("%s: slot_index %d appears twice", path, s.SlotIndex)
		}
		seen[s.SlotIndex] = true
	}
	return specs, nil
}
