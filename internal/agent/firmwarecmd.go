package agent

import (
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/firmware"
	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// newFirmwareCmd is `gpuaas-hostd firmware-profile check|apply`: the deploy-time helper that
// gpuaas-firmware-profile.service runs with the profile environment (GPUAAS_FIRMWARE_*).
func newFirmwareCmd(stdout io.Writer) *cobra.Command {
	dir := "/var/lib/gpuaas/firmware-profile"
	racadm := "racadm"
	cmd := &cobra.Command{Use: "firmware-profile", Short: "Check or apply the node's BIOS profile through RACADM (seed 003)"}
	helper := func() firmware.Helper { return firmware.Helper{Run: hostfs.Exec{}, Dir: dir, Racadm: racadm} }
	check := &cobra.Command{
		Use:   "check",
		Short: "Read the BIOS attributes the selected profile needs and report drift (changes nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := firmware.ProfileFromEnv(os.Getenv)
			if err != nil {
				return err
			}
			e, err := helper().Check(cmd.Context(), p)
			if perr := printJSON(stdout, e); perr != nil {
				return perr
			}
			if err == nil && e.Status != firmware.StatusVerified {
				err = errNotVerified(e.Status)
			}
			return err
		},
	}
	apply := &cobra.Command{
		Use:   "apply",
		Short: "Verify, or stage drift and do a controlled reboot (within GPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS); writes evidence",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := firmware.ProfileFromEnv(os.Getenv)
			if err != nil {
				return err
			}
			e, err := helper().Apply(cmd.Context(), p)
			if perr := printJSON(stdout, e); perr != nil {
				return perr
			}
			return err
		},
	}
	for _, c := range []*cobra.Command{check, apply} {
		c.Flags().StringVar(&dir, "evidence-dir", dir, "where evidence.json lives")
		c.Flags().StringVar(&racadm, "racadm", racadm, "the RACADM binary")
	}
	cmd.AddCommand(check, apply)
	return cmd
}

type errNotVerified string

func (e errNotVerified) Error() string { return "firmware profile not verified: " + string(e) }
