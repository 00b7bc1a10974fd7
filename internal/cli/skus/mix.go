package skus

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// MixOptions are `skus mix`'s dependencies, arguments and flags.
type MixOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	SKU     string
	Region  string
	Pin     []string // GPUS=WEIGHT
	Unpin   bool
	Yes     bool
	Entries []apiv1.DemandMixEntry // Pin, parsed
	Output  output.Format
}

// NewCmdMix is `skus mix SKU [--region R] [--pin GPUS=WEIGHT,... | --unpin --yes]`.
func NewCmdMix(f *cmdutil.Factory, runF func(*MixOptions) error) *cobra.Command {
	opts := &MixOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "mix SKU [--region REGION] [--pin GPUS=WEIGHT,... | --unpin --yes]",
		Short: "The demand mix a slice SKU's placement protects, and where it came from; pin or unpin it (admin)",
		Long: `The demand mix a slice SKU's placement protects: the request sizes its look-ahead keeps room
for, with their shares, and where the mix came from: learned (from N requests seen, created
and refused, decayed with a 6-hour half-life), pinned (by an admin) or default (not enough
history yet).

--pin 1=3,8=1 pins a mix: GPU counts the SKU sells, each with a relative weight. A pin wins
over what is learned until --unpin removes it (which needs --yes). Both are audited.`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.SKU = args[0]
			if len(opts.Pin) > 0 && opts.Unpin {
				return cmdutil.FlagErrorf("--pin and --unpin exclude each other")
			}
			if len(opts.Pin) > 0 && opts.Region != "" {
				return cmdutil.FlagErrorf("a pin is per SKU: --region applies to showing the mix")
			}
			for _, p := range opts.Pin {
				e, err := parseMixEntry(p)
				if err != nil {
					return err
				}
				opts.Entries = append(opts.Entries, e)
			}
			if opts.Unpin {
				if err := cmdutil.Confirm(opts.IO, opts.Yes, "Unpinning "+opts.SKU+"'s demand mix puts the learned mix (or the default) back into placement"); err != nil {
					return err
				}
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			var m *apiv1.DemandMix
			switch {
			case len(opts.Entries) > 0:
				m, err = c.PinDemandMix(cmd.Context(), opts.SKU, opts.Entries)
			case opts.Unpin:
				m, err = c.UnpinDemandMix(cmd.Context(), opts.SKU)
			default:
				m, err = c.DemandMix(cmd.Context(), opts.SKU, opts.Region)
			}
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, m, func(t *output.TableWriter) {
				t.Row("SKU:", opts.SKU)
				t.Row("Mix:", MixShares(m))
				t.Row("Source:", MixSource(m))
			})
		},
	}
	cmd.Flags().StringVar(&opts.Region, "region", "", "the mix placement uses in this region")
	cmd.Flags().StringSliceVar(&opts.Pin, "pin", nil, "pin the mix: GPUS=WEIGHT pairs, comma-separated (admin)")
	cmd.Flags().BoolVar(&opts.Unpin, "unpin", false, "remove the pinned mix (admin; with --yes)")
	cmd.Flags().BoolVar(&opts.Yes, "yes", false, "unpin without asking")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// parseMixEntry reads GPUS=WEIGHT.
func parseMixEntry(s string) (apiv1.DemandMixEntry, error) {
	g, w, ok := strings.Cut(s, "=")
	gpus, errG := strconv.Atoi(strings.TrimSpace(g))
	weight, errW := strconv.Atoi(strings.TrimSpace(w))
	if !ok || errG != nil || errW != nil || gpus <= 0 || weight <= 0 {
		return apiv1.DemandMixEntry{}, cmdutil.FlagErrorf("--pin %q: want GPUS=WEIGHT, both positive integers (1=3,8=1)", s)
	}
	return apiv1.DemandMixEntry{GPUs: gpus, Weight: weight}, nil
}

// MixShares renders a mix as "1:75% 8:25%".
func MixShares(m *apiv1.DemandMix) string {
	parts := make([]string, len(m.Entries))
	for i, e := range m.Entries {
		parts[i] = fmt.Sprintf("%d:%.0f%%", e.GPUs, e.Share*100)
	}
	return output.Dash(strings.Join(parts, " "))
}

// MixSource says where a mix came from: "learned from 1234 requests (region)", "pinned by
// ops at ...", "default (12 requests of the 50 needed)".
func MixSource(m *apiv1.DemandMix) string {
	switch m.Source {
	case "learned":
		scope := "in this region"
		if m.Scope == "sku" {
			scope = "in every region"
		}
		return fmt.Sprintf("learned from %.0f requests %s (decayed, 6 h half-life)", m.Requests, scope)
	case "pinned":
		s := "pinned by " + output.Dash(m.PinnedBy)
		if m.PinnedAt != nil {
			s += " at " + m.PinnedAt.UTC().Format("2006-01-02 15:04Z")
		}
		return s
	}
	return fmt.Sprintf("default (%.0f requests seen, a learned mix needs %.0f)", m.Requests, m.MinRequests)
}
