package quota

import (
	"errors"
	"io"
	"strings"
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

func TestSetFlagsLandInOptions(t *testing.T) {
	t.Parallel()
	var got *SetOptions
	cmd := NewCmdSet(&cmdutil.Factory{}, func(o *SetOptions) error { got = o; return nil })
	if err := execute(cmd, "acme", "--sku", "h200-sxm-slice", "--region", "east", "--gpus", "0", "--allocations", "3"); err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "acme" || got.SKU != "h200-sxm-slice" || got.Region != "east" || got.GPUs != 0 || got.Allocations != 3 {
		t.Fatalf("options = %+v", got)
	}
}

// A quota needs a SKU and at least one limit, never a negative one: usage errors, nothing sent.
func TestSetRefusesIncompleteOrNegativeLimits(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"acme", "--gpus", "4"},
		{"acme", "--sku", "s"},
		{"acme", "--sku", "s", "--gpus", "-1"},
		{"acme", "--sku", "s", "--allocations", "-2"},
		{"--sku", "s", "--gpus", "1"},
	} {
		ran := false
		err := execute(NewCmdSet(&cmdutil.Factory{}, func(*SetOptions) error { ran = true; return nil }), args...)
		var fe *cmdutil.FlagError
		if ran || !errors.As(err, &fe) {
			t.Errorf("quota set %v: ran %v, err %v; want a flag error and nothing run", args, ran, err)
		}
	}
}

// Deleting a quota lifts a limit: off a terminal it needs --yes.
func TestDeleteNeedsYes(t *testing.T) {
	t.Parallel()
	ran := false
	f := &cmdutil.Factory{IO: cmdutil.IOStreams{In: strings.NewReader(""), Out: io.Discard, ErrOut: io.Discard}}
	err := execute(NewCmdDelete(f, func(*DeleteOptions) error { ran = true; return nil }), "acme", "--sku", "s")
	if ran || err == nil || cmdutil.ExitCode(err) != cmdutil.ExitUsage {
		t.Fatalf("delete without --yes: ran %v, err %v", ran, err)
	}
	if err := execute(NewCmdDelete(f, func(*DeleteOptions) error { ran = true; return nil }), "acme", "--sku", "s", "--yes"); err != nil || !ran {
		t.Fatalf("delete --yes: ran %v, err %v", ran, err)
	}
}
