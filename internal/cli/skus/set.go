package skus

import (
	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

// NewCmdSet is `skus set SKU`: the SKU's image policies (admin).
func NewCmdSet(f *cmdutil.Factory) *cobra.Command {
	format := output.Table
	var warm, signed bool
	cmd := &cobra.Command{
		Use:   "set SKU [--warm-slots=true|false] [--requires-signed-images=true|false]",
		Short: "Set a SKU's image policies: warm slots, signed images (admin; docs/images.md)",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var p apiv1.SKUPatch
			if cmd.Flags().Changed("warm-slots") {
				p.WarmSlots = &warm
			}
			if cmd.Flags().Changed("requires-signed-images") {
				p.RequiresSignedImages = &signed
			}
			if p.WarmSlots == nil && p.RequiresSignedImages == nil {
				return cmdutil.FlagErrorf("give --warm-slots or --requires-signed-images")
			}
			c, err := f.Client()
			if err != nil {
				return err
			}
			s, err := c.PatchSKU(cmd.Context(), args[0], p)
			if err != nil {
				return err
			}
			return output.Print(f.IO.Out, format, s, func(t *output.TableWriter) {
				t.Row("SKU:", s.SKU)
				t.Row("Warm slots:", s.WarmSlots)
				t.Row("Requires signed images:", s.RequiresSignedImages)
			})
		},
	}
	cmd.Flags().BoolVar(&warm, "warm-slots", false, "hosts write the SKU's default image onto idle slots' disks after each wipe proof, so a provision of it skips the disk write")
	cmd.Flags().BoolVar(&signed, "requires-signed-images", false, "the SKU's slices boot only images signed by a trusted publisher key")
	cmdutil.AddOutputFlag(cmd, &format)
	return cmd
}
