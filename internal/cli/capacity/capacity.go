// Package capacity is `gpuaasctl capacity`: raw free slots versus topology-safe launchable
// capacity per SKU and region.
package capacity

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/cli/skus"
	"github.com/gpuaas/gpuaas/internal/client"
)

// Options are `capacity`'s dependencies and flags.
type Options struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	SKU    string
	Region string
	Output output.Format
}

// NewCmdCapacity is `capacity [--sku S] [--region R]`.
func NewCmdCapacity(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "capacity [--sku SKU] [--region REGION]",
		Short: "Raw free slots and topology-safe launchable capacity per SKU",
		Long: `Raw free slots and topology-safe launchable capacity per SKU and region.

LAUNCHABLE lists GPUS:COUNT pairs: how many allocations of that many GPUs could be placed
at once right now. Raw free slots are not additive with whole free baremetal nodes.`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			caps, err := c.Capacity(cmd.Context(), opts.SKU, opts.Region)
			if err != nil {
				return err
			}
			// Admins also see the demand mix placement protects and where it came from.
			admin := slices.ContainsFunc(caps, func(cp apiv1.Capacity) bool { return cp.DemandMix != nil })
			return output.Print(opts.IO.Out, opts.Output, output.List(caps), func(t *output.TableWriter) {
				cols := []any{"SKU", "REGION", "SHAPE", "RAW FREE SLOTS", "BLOCKED BY POLICY", "FREE NODES", "LAUNCHABLE (GPUS:COUNT)"}
				if admin {
					cols = append(cols, "DEMAND MIX", "MIX SOURCE")
				}
				t.Header("capacity entries", len(caps), cols...)
				for _, cp := range caps {
					row := []any{cp.SKU, cp.Region, cp.CapacityShape, cp.RawFreeSlots, cp.BlockedByPolicy, cp.FreeNodes, launchable(cp.Launchable)}
					if admin {
						mix, source := "-", "-"
						if cp.DemandMix != nil {
							mix, source = skus.MixShares(cp.DemandMix), skus.MixSource(cp.DemandMix)
						}
						row = append(row, mix, source)
					}
					t.Row(row...)
				}
			})
		},
	}
	cmd.Flags().StringVar(&opts.SKU, "sku", "", "only this SKU")
	cmd.Flags().StringVar(&opts.Region, "region", "", "only this region")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// launchable renders {"1":8,"2":4} as "1:8 2:4", in numeric GPU order.
func launchable(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, errA := strconv.Atoi(keys[i])
		b, errB := strconv.Atoi(keys[j])
		if errA != nil || errB != nil {
			return keys[i] < keys[j]
		}
		return a < b
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return output.Dash(strings.Join(parts, " "))
}
