package slots

import (
	"io"
	"os"
	"path/filepath"
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

// isFlagError: a usage-class refusal (exit 2): a bad flag, or a bad input file.
func isFlagError(err error) bool {
	return err != nil && cmdutil.ExitCode(err) == cmdutil.ExitUsage
}

func TestApplyAndEnableParse(t *testing.T) {
	t.Parallel()
	var a *ApplyOptions
	if err := execute(NewCmdApply(&cmdutil.Factory{}, func(o *ApplyOptions) error { a = o; return nil }), "n1", "-f", "map.yaml", "--dry-run"); err != nil {
		t.Fatal(err)
	}
	if a.Node != "n1" || a.File != "map.yaml" || !a.DryRun {
		t.Fatalf("apply = %+v", a)
	}
	if err := execute(NewCmdApply(&cmdutil.Factory{}, func(*ApplyOptions) error { return nil }), "n1"); !isFlagError(err) {
		t.Fatalf("apply without -f: %v", err)
	}
	var e *EnableOptions
	if err := execute(NewCmdDisable(&cmdutil.Factory{}, func(o *EnableOptions) error { e = o; return nil }), "n1", "3"); err != nil || e.Index != 3 || e.Enable {
		t.Fatalf("disable = %+v, %v", e, err)
	}
	if err := execute(NewCmdEnable(&cmdutil.Factory{}, func(*EnableOptions) error { return nil }), "n1", "x"); !isFlagError(err) {
		t.Fatalf("bad index: %v", err)
	}
	var ap *ApproveOptions
	if err := execute(NewCmdApprove(&cmdutil.Factory{}, func(o *ApproveOptions) error { ap = o; return nil }), "n1", "--slot", "1", "--slot", "2", "--dry-run"); err != nil || len(ap.SlotIndexes) != 2 {
		t.Fatalf("approve = %+v, %v", ap, err)
	}
	if err := execute(NewCmdApprove(&cmdutil.Factory{}, func(*ApproveOptions) error { return nil }), "n1", "--all-ready"); !isFlagError(err) {
		t.Fatalf("approve without --yes or --dry-run: %v", err)
	}
}

func TestReadSlotMap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	slot := "slot_index: 3\n  pci_address: 0000:1b:00.0\n  nvme_device: /dev/disk/by-id/nvme-x\n  mac_address: \"52:54:00:00:00:01\"\n  private_ip: 10.0.0.1\n  numa_node: 0\n"
	for _, p := range []string{
		write("list.yaml", "- "+slot),
		write("wrapped.yaml", "slots:\n- "+slot),
		write("list.json", `[{"slot_index":3,"pci_address":"0000:1b:00.0","nvme_device":"/dev/disk/by-id/nvme-x","numa_node":0}]`),
	} {
		specs, err := ReadSlotMap(nil, p)
		if err != nil || len(specs) != 1 || specs[0].SlotIndex != 3 || specs[0].PCIAddress != "0000:1b:00.0" || specs[0].NUMANode == nil {
			t.Fatalf("%s: %+v, %v", p, specs, err)
		}
	}
	for name, content := range map[string]string{
		"typo.yaml":  "- slot_index: 0\n  pci_adress: typo\n",
		"other.yaml": "slots: []\nnode: x\n",
		"empty.yaml": "slots: []\n",
		"dup.yaml":   "- slot_index: 1\n- slot_index: 1\n",
		"scalar.yml": "hello\n",
	} {
		if _, err := ReadSlotMap(nil, write(name, content)); !isFlagError(err) {
			t.Errorf("%s accepted: %v", name, err)
		}
	}
	if _, err := ReadSlotMap(strings.NewReader("- slot_index: 2\n"), "-"); err != nil {
		t.Fatalf("stdin: %v", err)
	}
	// A CPU list may be one bare number; housekeeping_cpus "" keeps no CPU back.
	m, err := ReadSlotMapDoc(strings.NewReader("housekeeping_cpus: \"\"\nslots:\n- slot_index: 0\n  host_cpus: 1\n- slot_index: 1\n  host_cpus: 2-3,8\n"), "-")
	if err != nil || m.HousekeepingCPUs == nil || *m.HousekeepingCPUs != "" || m.Slots[0].HostCPUs != "1" || m.Slots[1].HostCPUs != "2-3,8" {
		t.Fatalf("cpu lists: %+v, %v", m, err)
	}
	for _, bad := range []string{"housekeeping_cpus: [1]\nslots:\n- slot_index: 0\n", "- slot_index: 0\n  host_cpus: 1.5\n", "- slot_index: 0\n  host_cpus: 9000\n"} {
		if _, err := ReadSlotMapDoc(strings.NewReader(bad), "-"); !isFlagError(err) {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}
