package controller

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/systemd"
)

func newUnitCmd(stdout io.Writer) *cobra.Command {
	const unit = "gpuaas-controller.service"
	return &cobra.Command{
		Use:   "systemd-unit [" + unit + "]",
		Short: "Print the controller's systemd unit (without an argument: how to install it)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				fmt.Fprint(stdout, systemd.InstallHint("gpuaas-controller", unit))
				fmt.Fprintln(stdout, "Put GPUAAS_DATABASE_URL=postgres://... in /etc/gpuaas/controller.env for an external PostgreSQL.")
				return nil
			}
			if args[0] != unit {
				return fmt.Errorf("no unit %q (have %s)", args[0], unit)
			}
			text, err := systemd.Unit(unit)
			if err == nil {
				_, err = io.WriteString(stdout, text)
			}
			return err
		},
	}
}
