package agent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
)

func newDebugCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "debug", Short: "Inspect what hostd would do, without doing it"}
	var plan, root, dataDir, bridge string
	var lab bool
	dx := &cobra.Command{
		Use:   "domain-xml --plan FILE [--lab]",
		Short: "Print the libvirt domain XML hostd would define for a slice.vm_provision plan",
		Long: `Reads a slice.vm_provision payload (JSON, as "gpuaasctl tasks show -o json" prints it) and
prints the domain XML the libvirt runtime (or, with --lab, the lab runtime) would define.
vCPU pinning reads the slots' NUMA CPU lists under --host-root. Nothing is defined.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			raw, err := os.ReadFile(plan)
			if err != nil {
				return err
			}
			v, err := task.DecodePayload(task.TypeVMProvision, raw)
			if err != nil {
				return err
			}
			p := v.(*task.VMProvision)
			dir := filepath.Join(dataDir, "slices", p.AllocationID)
			xml, placed, err := slicevm.BuildDomain(slicevm.DomainInput{Plan: p, SeedISO: filepath.Join(dir, "seed.iso"), NVRAM: filepath.Join(dir, "OVMF_VARS.fd"),
				ConsoleLog: filepath.Join(dir, "console.log"), Lab: lab, Bridge: bridge, OVS: !lab, Loader: "/usr/share/OVMF/OVMF_CODE_4M.fd", FS: hostfs.New(root)})
			if err != nil {
				return fmt.Errorf("plan %s: %w", plan, err)
			}
			if _, err = stdout.Write(xml); err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.ErrOrStderr(), "placement: %s\n", placed)
			return err
		},
	}
	dx.Flags().StringVar(&plan, "plan", "", "slice.vm_provision payload (JSON file)")
	dx.Flags().StringVar(&root, "host-root", "/", "root of the host tree (NUMA CPU lists)")
	dx.Flags().StringVar(&dataDir, "data-dir", "/var/lib/gpuaas", "slice data dir (seed ISO and NVRAM paths)")
	dx.Flags().StringVar(&bridge, "bridge", "ovsbr0", "slice bridge")
	dx.Flags().BoolVar(&lab, "lab", false, "the lab runtime's domain (software emulation, no passthrough)")
	_ = dx.MarkFlagRequired("plan")
	cmd.AddCommand(dx)
	return cmd
}
