package nodes

import (
	"errors"
	"testing"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

// Revoking cuts a host off: off a terminal without --yes it is refused (exit 2) and nothing runs.
func TestRevokeNeedsYes(t *testing.T) {
	t.Parallel()
	ran := false
	var fe *cmdutil.FlagError
	if err := execute(NewCmdRevoke(&cmdutil.Factory{}, func(*RevokeOptions) error { ran = true; return nil }), "n1"); cmdutil.ExitCode(err) != cmdutil.ExitUsage || ran {
		t.Fatalf("without --yes: %v (ran %v)", err, ran)
	}
	var got *RevokeOptions
	if err := execute(NewCmdRevoke(&cmdutil.Factory{}, func(o *RevokeOptions) error { got = o; return nil }), "n1", "--yes"); err != nil || got.Node != "n1" {
		t.Fatalf("with --yes: %v %+v", err, got)
	}
	if err := execute(NewCmdRevoke(&cmdutil.Factory{}, func(*RevokeOptions) error { return nil }), "--yes"); !errors.As(err, &fe) {
		t.Fatalf("no node: %v", err)
	}
}
