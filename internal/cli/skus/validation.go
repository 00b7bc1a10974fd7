package skus

import (
	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

// NewCmdValidation is `skus validation SKU POLICY`: what runs on a slot between its wipe and
// its next sale (docs/health.md).
func NewCmdValidation(f *cmdutil.Factory) *cobra.Command {
	format := output.Table
	cmd := &cobra.Command{
		Use:   "validation SKU none|quick|burn-in",
		Short: "Set what validates a slot between tenants: none, quick (PCIe checks and a reset) or burn-in (a validation VM) (admin)",
		Args:  cmdutil.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.Client()
			if err != nil {
				return err
			}
			policy := args[1]
			s, err := c.PatchSKU(cmd.Context(), args[0], apiv1.SKUPatch{ValidationPolicy: &policy})
			if err != nil {
				return err
			}
			return output.Print(f.IO.Out, format, s, func(t *output.TableWriter) {
				t.Row("SKU:", s.SKU)
				t.Row("Validation:", s.ValidationPolicy)
			})
		},
	}
	cmdutil.AddOutputFlag(cmd, &format)
	return cmd
}
