package slots

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/cpuset"
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
diff. FILE is YAML or JSON: a list of slots, or {slots: [...], housekeeping_cpus: LIST}, with the
API's field names (slot_index, pci_address, nvme_device, numa_node, host_cpus, mac_address,
private_ip, ...). Unknown keys are refused. Slots the map leaves out are disabled. "-" reads
the map from standard input.

host_cpus is the slot's own host CPU set (cpulist, e.g. "1-11,97-107"), disjoint from every
other slot's and from the node's housekeeping set. A slot without it gets one from the node's
latest discovery (whole cores of its NUMA node, divided among the slots that name none), or
none when the node has no discovery. housekeeping_cpus replaces the node's housekeeping set
("" keeps no CPU back); left out, the node keeps its set (the first core of each NUMA node
when it has none and slots are filled from discovery).`,
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
	m, err := ReadSlotMapDoc(opts.IO.In, opts.File)
	if err != nil {
		return err
	}
	for _, n := range m.Notes {
		fmt.Fprintln(opts.IO.ErrOut, "note: "+n)
	}
	c, err := opts.Client()
	if err != nil {
		return err
	}
	res, err := c.ApplySlots(ctx, opts.Node, apiv1.SlotApply{Slots: m.Slots, HousekeepingCPUs: m.HousekeepingCPUs, DryRun: opts.DryRun})
	if err != nil {
		return err
	}
	return printChanges(opts.IO.Out, opts.Output, res, "applied")
}

// SlotMap is a slot map file: its slots and, when it names one, the node's housekeeping CPU
// set (the CPUs kept back from every slot for the host).
type SlotMap struct {
	Slots            []apiv1.SlotSpec
	HousekeepingCPUs *string
	Notes            []string // what reading it left out, for the user (a listing's read-only fields)
}

// ReadSlotMap reads a YAML or JSON slot map's slots (see ReadSlotMapDoc).
func ReadSlotMap(in io.Reader, path string) ([]apiv1.SlotSpec, error) {
	m, err := ReadSlotMapDoc(in, path)
	return m.Slots, err
}

// ReadSlotMapDoc reads a YAML or JSON slot map: a list of slots, or a document with the key
// slots and optionally housekeeping_cpus. Unknown fields, an empty map and CPU lists that do
// not parse are refused.
func ReadSlotMapDoc(in io.Reader, path string) (SlotMap, error) {
	var out SlotMap
	doc, err := cmdutil.ReadYAMLOrJSON(in, path)
	if err != nil {
		return out, err
	}
	if m, ok := doc.(map[string]any); ok {
		if _, listed := m["items"]; listed && len(m) == 1 {
			return fromList(m["items"], path)
		}
		var other []string
		for k := range m {
			if k != "slots" && k != "housekeeping_cpus" {
				other = append(other, k)
			}
		}
		if len(other) > 0 {
			sort.Strings(other)
			return out, cmdutil.InputErrorf("%s: unknown top-level key(s) %s: want a list of slots or {slots: [...], housekeeping_cpus: LIST}", path, cmdutil.KeyNames(other))
		}
		if v, ok := m["housekeeping_cpus"]; ok {
			hk, isStr := cpuListText(v)
			if _, err := cpuset.Parse(hk); !isStr || err != nil {
				return out, cmdutil.InputErrorf("%s: housekeeping_cpus must be a CPU list such as \"0,96\" (\"\" keeps none back)", path)
			}
			out.HousekeepingCPUs = &hk
		}
		doc = m["slots"]
	}
	return decodeSlots(doc, path, out)
}

// fromList reads what `slots list -o yaml|json` prints ({items: [...]}) as the slot map it
// shows: get, edit, apply, as kubectl does. Fields the controller reports but a map does not
// set (id, status, allocation, ...) are left out with a note; disabled slots are left out
// too (a slot missing from a map stays disabled), so the list applies unchanged.
func fromList(items any, path string) (SlotMap, error) {
	var out SlotMap
	list, ok := items.([]any)
	if !ok {
		return out, cmdutil.InputErrorf("%s: items is not a list of slots", path)
	}
	writable := map[string]bool{}
	t := reflect.TypeOf(apiv1.SlotSpec{})
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		writable[name] = true
	}
	ignored := map[string]bool{}
	var kept []any
	for _, it := range list {
		sl, ok := it.(map[string]any)
		if !ok {
			return out, cmdutil.InputErrorf("%s: an item is not a slot", path)
		}
		if sl["status"] == "disabled" {
			out.Notes = append(out.Notes, fmt.Sprintf("slot %v is disabled: left out of the map, so it stays disabled", sl["slot_index"]))
			continue
		}
		for k := range sl {
			if !writable[k] {
				ignored[k] = true
				delete(sl, k)
			}
		}
		kept = append(kept, sl)
	}
	if len(ignored) > 0 {
		names := make([]string, 0, len(ignored))
		for k := range ignored {
			names = append(names, k)
		}
		sort.Strings(names)
		out.Notes = append(out.Notes, "read-only fields of the listing ignored: "+cmdutil.KeyNames(names))
	}
	return decodeSlots(kept, path, out)
}

// decodeSlots decodes a list of slots strictly into out.Slots.
func decodeSlots(doc any, path string, out SlotMap) (SlotMap, error) {
	items, ok := doc.([]any)
	if !ok {
		return out, cmdutil.InputErrorf("%s: not a slot map: want a list of slots or {slots: [...]}", path)
	}
	for _, it := range items { // host_cpus: 5 (one CPU, unquoted) is the list "5"
		if sl, ok := it.(map[string]any); ok {
			if text, ok := cpuListText(sl["host_cpus"]); ok && sl["host_cpus"] != nil {
				sl["host_cpus"] = text
			}
		}
	}
	var specs []apiv1.SlotSpec
	if err := cmdutil.DecodeStrict(doc, &specs, path); err != nil {
		return out, err
	}
	if len(specs) == 0 {
		return out, cmdutil.InputErrorf("%s holds no slots", path)
	}
	seen := map[int]bool{}
	for _, s := range specs {
		if seen[s.SlotIndex] {
			return out, cmdutil.InputErrorf("%s: slot_index %d appears twice", path, s.SlotIndex)
		}
		seen[s.SlotIndex] = true
		if _, err := cpuset.Parse(s.HostCPUs); err != nil {
			return out, cmdutil.InputErrorf("%s: slot %d: host_cpus: %v", path, s.SlotIndex, err)
		}
	}
	out.Slots = specs
	return out, nil
}

// cpuListText is a CPU list as YAML may write it: a string, or a bare number for one CPU.
func cpuListText(v any) (string, bool) {
	switch n := v.(type) {
	case nil:
		return "", true
	case string:
		return n, true
	case int, int64, uint64, float64, json.Number:
		return fmt.Sprint(n), true
	}
	return "", false
}
