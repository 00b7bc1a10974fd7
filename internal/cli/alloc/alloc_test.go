package alloc

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

// execute runs a command built for a parse-only test (runF captures the options).
func execute(cmd *cobra.Command, args ...string) error {
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	return cmd.Execute()
}

func isFlagError(err error) bool {
	var fe *cmdutil.FlagError
	return errors.As(err, &fe)
}

func TestCreateFlagsLandInOptions(t *testing.T) {
	t.Parallel()
	f := &cmdutil.Factory{}
	var got *CreateOptions
	cmd := NewCmdCreate(f, func(o *CreateOptions) error { got = o; return nil })
	err := execute(cmd, "--sku", "h200-sxm-slice", "--gpus", "4", "--region", "lab", "--image", "ubuntu-24.04",
		"--profile", "p1", "--ssh-key", "a.pub", "--ssh-key", "b.pub", "--tenant", "t1",
		"--idempotency-key", "k1", "--wait", "--timeout", "90s", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	want := CreateOptions{SKU: "h200-sxm-slice", GPUs: 4, Region: "lab", Image: "ubuntu-24.04", Profile: "p1",
		TenantID: "t1", IdempotencyKey: "k1", Wait: true, Timeout: 90 * time.Second, Output: output.JSON}
	if got.SKU != want.SKU || got.GPUs != want.GPUs || got.Region != want.Region || got.Image != want.Image ||
		got.Profile != want.Profile || got.TenantID != want.TenantID || got.IdempotencyKey != want.IdempotencyKey ||
		got.Wait != want.Wait || got.Timeout != want.Timeout || got.Output != want.Output ||
		len(got.SSHKeyFiles) != 2 || got.SSHKeyFiles[1] != "b.pub" {
		t.Fatalf("options = %+v", got)
	}
}

func TestCreateDefaultsAndRequiredFlags(t *testing.T) {
	t.Parallel()
	var got *CreateOptions
	cmd := NewCmdCreate(&cmdutil.Factory{}, func(o *CreateOptions) error { got = o; return nil })
	if err := execute(cmd, "--sku", "s", "--gpus", "1"); err != nil {
		t.Fatal(err)
	}
	if got.Output != output.Table || got.IdempotencyKey != "" || got.Wait || got.Timeout != 30*time.Minute {
		t.Fatalf("defaults = %+v", got)
	}
	for _, args := range [][]string{
		{"--gpus", "1"},
		{"--sku", "s"},
		{"--sku", "s", "--gpus", "0"},
		{"--sku", "s", "--gpus", "1", "extra"},
	} {
		cmd := NewCmdCreate(&cmdutil.Factory{}, func(*CreateOptions) error { t.Fatal("runF called"); return nil })
		if err := execute(cmd, args...); !isFlagError(err) {
			t.Errorf("%v: %v, want a FlagError", args, err)
		}
	}
}

func TestListShowExplainWaitParse(t *testing.T) {
	t.Parallel()
	f := &cmdutil.Factory{}
	var l *ListOptions
	if err := execute(NewCmdList(f, func(o *ListOptions) error { l = o; return nil }), "--status", "active", "-o", "yaml"); err != nil {
		t.Fatal(err)
	}
	if l.Status != "active" || l.Output != output.YAML {
		t.Fatalf("list = %+v", l)
	}
	var s *ShowOptions
	if err := execute(NewCmdShow(f, func(o *ShowOptions) error { s = o; return nil }), "a-123"); err != nil || s.ID != "a-123" {
		t.Fatalf("show = %+v, %v", s, err)
	}
	var e *ExplainOptions
	if err := execute(NewCmdExplain(f, func(o *ExplainOptions) error { e = o; return nil }), "--sku", "s", "--gpus", "8", "--region", "r"); err != nil {
		t.Fatal(err)
	}
	if e.SKU != "s" || e.GPUs != 8 || e.Region != "r" {
		t.Fatalf("explain = %+v", e)
	}
	var w *WaitOptions
	if err := execute(NewCmdWait(f, func(o *WaitOptions) error { w = o; return nil }), "a-1", "--for", "released"); err != nil || w.For != "released" {
		t.Fatalf("wait = %+v, %v", w, err)
	}
	if err := execute(NewCmdWait(f, func(*WaitOptions) error { return nil }), "a-1", "--for", "gone"); !isFlagError(err) {
		t.Fatalf("bad --for: %v", err)
	}
	if err := execute(NewCmdRelease(f, func(*ReleaseOptions) error { return nil })); !isFlagError(err) {
		t.Fatalf("release without ID: %v", err)
	}
}

// TestWaitEndsAtStatesThatCannotReachTheTarget: failed ends any wait with exit 1; releasing
// and released end a wait for active with exit 5; states on the way keep waiting.
func TestWaitEndsAtStatesThatCannotReachTheTarget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status, target string
		code           int
	}{
		{"failed", "active", cmdutil.ExitError}, {"failed", "released", cmdutil.ExitError},
		{"released", "active", cmdutil.ExitConflict}, {"releasing", "active", cmdutil.ExitConflict},
		{"requested", "active", -1}, {"provisioning", "active", -1}, {"active", "released", -1}, {"releasing", "released", -1},
	} {
		err := unreachable(&apiv1.Allocation{ID: "a1", Status: tc.status}, tc.target)
		if tc.code < 0 {
			if err != nil {
				t.Errorf("%s waiting for %s: %v", tc.status, tc.target, err)
			}
			continue
		}
		if err == nil || cmdutil.ExitCode(err) != tc.code {
			t.Errorf("%s waiting for %s: %v (exit %d, want %d)", tc.status, tc.target, err, cmdutil.ExitCode(err), tc.code)
		}
	}
}
