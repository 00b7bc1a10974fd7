package agent

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/systemd"
)

// newUnitCmd prints the host's systemd units and how to install them.
func newUnitCmd(stdout io.Writer) *cobra.Command {
	hostUnits := []string{"gpuaas-host-bootstrap.service", "gpuaas-firmware-profile.service", "gpuaas-hostd.service"}
	return &cobra.Command{
		Use:   "systemd-unit [UNIT]",
		Short: "Print a systemd unit gpuaas-hostd ships (without UNIT: the list and how to install them)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				fmt.Fprint(stdout, systemd.InstallHint("gpuaas-hostd", hostUnits...))
				fmt.Fprintln(stdout, "(MAAS hosts get all of this from `gpuaasctl nodes cloud-init NODE`.)")
				return nil
			}
			for _, u := range hostUnits {
				if u == args[0] {
					text, err := systemd.Unit(u)
					if err == nil {
						_, err = io.WriteString(stdout, text)
					}
					return err
				}
			}
			return fmt.Errorf("no unit %q (have %v)", args[0], hostUnits)
		},
	}
}
