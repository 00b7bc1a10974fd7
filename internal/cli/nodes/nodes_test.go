package nodes

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

func TestAddFlagsLandInOptions(t *testing.T) {
	t.Parallel()
	var got *AddOptions
	cmd := NewCmdAdd(&cmdutil.Factory{}, func(o *AddOptions) error { got = o; return nil })
	err := execute(cmd, "h200-01", "--region", "lab", "--sku", "bm", "--slice-sku", "sl", "--tenant", "t1",
		"--profile-tag", "gpuaas-profile-slice-vm", "--hardware-tag", "gpu-nvidia-h200", "--hardware-tag", "nvme-4")
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "h200-01" || got.Region != "lab" || got.SKU != "bm" || got.SliceSKU != "sl" || got.TenantID != "t1" ||
		len(got.ProfileTags) != 1 || len(got.HardwareTags) != 2 {
		t.Fatalf("options = %+v", got)
	}
	var fe *cmdutil.FlagError
	if err := execute(NewCmdAdd(&cmdutil.Factory{}, func(*AddOptions) error { return nil }), "h200-01"); !errors.As(err, &fe) {
		t.Fatalf("missing --region: %v", err)
	}
}

func TestDrainUndrainAndStorageTransitionParse(t *testing.T) {
	t.Parallel()
	var d *DrainOptions
	if err := execute(NewCmdDrain(&cmdutil.Factory{}, func(o *DrainOptions) error { d = o; return nil }), "n1"); err != nil || d.Node != "n1" || !d.Drain {
		t.Fatalf("drain = %+v, %v", d, err)
	}
	if err := execute(NewCmdUndrain(&cmdutil.Factory{}, func(o *DrainOptions) error { d = o; return nil }), "n2"); err != nil || d.Node != "n2" || d.Drain {
		t.Fatalf("undrain = %+v, %v", d, err)
	}
	var st *StorageTransitionOptions
	cmd := NewCmdStorageTransition(&cmdutil.Factory{}, func(o *StorageTransitionOptions) error { st = o; return nil })
	if err := execute(cmd, "n1", "--devices", "/dev/a,/dev/b", "--apply", "--confirm", "n1"); err != nil || len(st.Devices) != 2 || !st.Apply {
		t.Fatalf("storage-transition = %+v, %v", st, err)
	}
	var fe *cmdutil.FlagError
	cmd = NewCmdStorageTransition(&cmdutil.Factory{}, func(*StorageTransitionOptions) error { return nil })
	if err := execute(cmd, "n1", "--devices", "/dev/a", "--apply"); !errors.As(err, &fe) {
		t.Fatalf("--apply without --confirm: %v", err)
	}
}
