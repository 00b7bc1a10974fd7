package tokens

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

func TestCreateParse(t *testing.T) {
	t.Parallel()
	run := func(args ...string) (*CreateOptions, error) {
		var got *CreateOptions
		cmd := NewCmdCreate(&cmdutil.Factory{}, func(o *CreateOptions) error { got = o; return nil })
		cmd.SetArgs(args)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.SilenceErrors, cmd.SilenceUsage = true, true
		return got, cmd.Execute()
	}
	got, err := run("--name", "ci", "--role", "tenant", "--tenant", "t1", "--ttl", "720h", "-o", "json")
	if err != nil || got.Name != "ci" || got.Role != "tenant" || got.TenantID != "t1" || got.TTL != 720*time.Hour || got.Output != output.JSON {
		t.Fatalf("options = %+v, %v", got, err)
	}
	var fe *cmdutil.FlagError
	for _, args := range [][]string{
		{"--role", "admin"},
		{"--name", "x", "--role", "root"},
		{"--name", "x", "--role", "tenant"},
		{"--name", "x", "--role", "admin", "--tenant", "t1"},
	} {
		if _, err := run(args...); !errors.As(err, &fe) {
			t.Errorf("%v: %v, want a FlagError", args, err)
		}
	}
}
