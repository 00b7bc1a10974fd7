package reservations

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

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

func TestCreateFlagsLandInOptions(t *testing.T) {
	t.Parallel()
	var got *CreateOptions
	cmd := NewCmdCreate(&cmdutil.Factory{}, func(o *CreateOptions) error { got = o; return nil })
	if err := execute(cmd, "--sku", "h200-sxm-slice", "--gpus", "8", "--region", "lab", "--duration", "72h", "--tenant", "t1"); err != nil {
		t.Fatal(err)
	}
	if got.SKU != "h200-sxm-slice" || got.GPUs != 8 || got.Region != "lab" || got.Duration != 72*time.Hour || got.TenantID != "t1" {
		t.Fatalf("options = %+v", got)
	}
}

func TestCreateRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--gpus", "1"},
		{"--sku", "s"},
		{"--sku", "s", "--gpus", "1", "--duration", "-1h"},
		{"--sku", "s", "--gpus", "1", "--duration", "10ms"},
	} {
		ran := false
		err := execute(NewCmdCreate(&cmdutil.Factory{}, func(*CreateOptions) error { ran = true; return nil }), args...)
		var fe *cmdutil.FlagError
		if ran || !errors.As(err, &fe) {
			t.Errorf("reservations create %v: ran %v, err %v; want a flag error", args, ran, err)
		}
	}
}

// Cancelling gives held GPUs back to the fleet: off a terminal it needs --yes.
func TestCancelNeedsYes(t *testing.T) {
	t.Parallel()
	ran := false
	f := &cmdutil.Factory{IO: cmdutil.IOStreams{In: strings.NewReader(""), Out: io.Discard, ErrOut: io.Discard}}
	err := execute(NewCmdCancel(f, func(*CancelOptions) error { ran = true; return nil }), "r1")
	if ran || cmdutil.ExitCode(err) != cmdutil.ExitUsage {
		t.Fatalf("cancel without --yes: ran %v, err %v", ran, err)
	}
	if err := execute(NewCmdCancel(f, func(*CancelOptions) error { ran = true; return nil }), "r1", "-y"); err != nil || !ran {
		t.Fatalf("cancel -y: ran %v, err %v", ran, err)
	}
}
