package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

// TestFlagUsageHasNoBackticks: pflag reads the first `quoted` word of a flag's usage as the
// name of its value, so "(see `gpuaasctl skus list`)" printed as
// "--sku gpuaasctl skus list   SKU, e.g. ...". No flag of any command may carry one.
func TestFlagUsageHasNoBackticks(t *testing.T) {
	root := NewCmdRoot(cmdutil.New(cmdutil.IOStreams{}, func(string) string { return "" }, "test"))
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backtick", c.CommandPath(), f.Name, f.Usage)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
