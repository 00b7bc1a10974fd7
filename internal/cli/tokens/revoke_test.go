package tokens

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

func TestRevokeAndListParse(t *testing.T) {
	t.Parallel()
	var got *RevokeOptions
	if err := execute(NewCmdRevoke(&cmdutil.Factory{}, func(o *RevokeOptions) error { got = o; return nil }), "tok-1"); err != nil || got.ID != "tok-1" {
		t.Fatalf("revoke ID: %v %+v", err, got)
	}
	var fe *cmdutil.FlagError
	for _, args := range [][]string{{}, {"a", "b"}} {
		if err := execute(NewCmdRevoke(&cmdutil.Factory{}, func(*RevokeOptions) error { return nil }), args...); !errors.As(err, &fe) {
			t.Errorf("revoke %v: %v, want a FlagError", args, err)
		}
	}
	if err := execute(NewCmdList(&cmdutil.Factory{}, func(*ListOptions) error { return nil }), "extra"); !errors.As(err, &fe) {
		t.Errorf("list with an argument: %v", err)
	}
}
