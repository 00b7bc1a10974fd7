package images

import (
	"errors"
	"io"
	"testing"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

func execute(cmd *cobra.Command, args ...string) error {
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	return cmd.Execute()
}

func TestLifecycleCommandsParse(t *testing.T) {
	t.Parallel()
	var fe *cmdutil.FlagError
	var to *TestOptions
	if err := execute(NewCmdTest(&cmdutil.Factory{}, func(o *TestOptions) error { to = o; return nil }), "v2", "--node", "h200-01", "--wait"); err != nil ||
		to.Image != "v2" || to.Node != "h200-01" || !to.Wait {
		t.Fatalf("test = %+v, %v", to, err)
	}
	if err := execute(NewCmdTest(&cmdutil.Factory{}, func(*TestOptions) error { return nil }), "v2"); !errors.As(err, &fe) {
		t.Fatalf("test without --node: %v", err)
	}
	var ro *RolloutOptions
	if err := execute(newCmdRolloutStart(&cmdutil.Factory{}, func(o *RolloutOptions) error { ro = o; return nil }),
		"h200-sxm-slice", "v2", "--share", "10", "--region", "eu-1", "--region", "us-2"); err != nil ||
		ro.SKU != "h200-sxm-slice" || ro.Image != "v2" || ro.Share != 10 || len(ro.Regions) != 2 {
		t.Fatalf("rollout start = %+v, %v", ro, err)
	}
	for _, bad := range [][]string{{"s", "v2"}, {"s", "v2", "--share", "101"}, {"s", "v2", "--share", "-1"}} {
		if err := execute(newCmdRolloutStart(&cmdutil.Factory{}, func(*RolloutOptions) error { return nil }), bad...); !errors.As(err, &fe) {
			t.Fatalf("rollout start %v: %v", bad, err)
		}
	}
	if err := execute(NewCmdDefault(&cmdutil.Factory{}, func(o *RolloutOptions) error { ro = o; return nil }), "sku", "v1"); err != nil ||
		ro.SKU != "sku" || ro.Image != "v1" {
		t.Fatalf("default = %+v, %v", ro, err)
	}
	if err := execute(newCmdRolloutFinish(&cmdutil.Factory{}, func(o *RolloutOptions) error { ro = o; return nil }, false), "sku2"); err != nil || ro.SKU != "sku2" {
		t.Fatalf("rollback = %+v, %v", ro, err)
	}
}
