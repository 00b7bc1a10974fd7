package tokens

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

func TestRevokeAndListParse(t *testing.T) {
	t.Parallel()
	var got *RevokeOptions
	if err := execute(NewCmdRevoke(&cmdutil.Factory{}, func(o *RevokeOptions) error { got = o; return nil }), "tok-1", "--yes"); err != nil || got.ID != "tok-1" {
		t.Fatalf("revoke ID: %v %+v", err, got)
	}
	// Off a terminal, without --yes, nothing is revoked and the refusal names --yes (exit 2).
	got = nil
	err := execute(NewCmdRevoke(&cmdutil.Factory{}, func(o *RevokeOptions) error { got = o; return nil }), "tok-1")
	if got != nil || err == nil || !strings.Contains(err.Error(), "--yes") || cmdutil.ExitCode(err) != cmdutil.ExitUsage {
		t.Fatalf("revoke without --yes: %v (ran: %v)", err, got != nil)
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
