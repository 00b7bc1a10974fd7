package nodes

import (
	"fmt"
	"net"
	"net/url"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cloudinit"
	"github.com/gpuaas/gpuaas/systemd"
)

// The first H200 slice VM firmware profile (seed 003).
const (
	sliceFirmwareVersion = "h200-xe9680l-slice-vm-v1"
	sliceFirmwareAttrs   = "BIOS.ProcSettings.ProcVirtualization=Enabled BIOS.ProcSettings.LogicalProc=Enabled BIOS.IntegratedDevices.SriovGlobalEnable=Enabled"
)

// NewCmdCloudInit is `nodes cloud-init NODE --profile slice-vm|baremetal`.
func NewCmdCloudInit(f *cmdutil.Factory) *cobra.Command {
	var h cloudinit.HostSeed
	noApply, noReboot := false, false
	serverURL := ""
	cmd := &cobra.Command{
		Use:   "cloud-init NODE --profile slice-vm|baremetal --hostd-url URL --hostd-sha256 HEX",
		Short: "Render the node's MAAS deploy user-data: CA, profile env, units, gpuaas-hostd, enrollment",
		Long: `Prints MAAS deploy user-data for one node and its GPUaaS profile tag. It embeds the
controller URL and CA this gpuaasctl trusts, a fresh one-time bootstrap token, the firmware
profile environment (seed 003), and the systemd units; on the host it fetches gpuaas-hostd
(checking its sha256), starts the firmware-profile helper, and for slice-vm enrolls and
starts gpuaas-hostd. The output holds the token: pass it to MAAS, do not store it.`,
		Example: `  gpuaasctl nodes cloud-init h200-01 --profile slice-vm --hostd-url https://repo.example/gpuaas-hostd --hostd-sha256 $(sha256sum bin/gpuaas-hostd | cut -d' ' -f1) > h200-01.user-data
  maas $PROFILE machine deploy $SYSTEM_ID user_data=$(base64 -w0 h200-01.user-data)`,
		Args: cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h.Node = args[0]
			switch h.Profile {
			case cloudinit.ProfileSliceVM:
				if h.FirmwareVersion == "" {
					h.FirmwareVersion = sliceFirmwareVersion
				}
				if h.FirmwareAttrs == "" {
					h.FirmwareAttrs = sliceFirmwareAttrs
				}
			case cloudinit.ProfileBaremetal:
				if h.FirmwareVersion == "" || h.FirmwareAttrs == "" {
					return cmdutil.FlagErrorf("--profile baremetal needs --firmware-version and --firmware-attrs (its RACADM profile is site-specific)")
				}
			default:
				return cmdutil.FlagErrorf("--profile must be slice-vm or baremetal")
			}
			if h.HostdURL == "" || h.HostdSHA256 == "" {
				return cmdutil.FlagErrorf("--hostd-url and --hostd-sha256 are required")
			}
			h.ApplyIfNeeded, h.RebootOnChange = !noApply, !noReboot
			cfg, err := f.Config()
			if err != nil {
				return err
			}
			if cfg.CAFile == "" {
				return cmdutil.FlagErrorf("the controller CA is needed for the host: set --ca-file or the context's ca_file")
			}
			if h.CAPEM, err = os.ReadFile(cfg.CAFile); err != nil {
				return err
			}
			// The host reaches the controller from elsewhere: the address this CLI used may be
			// one only this machine can reach.
			h.Server = serverURL
			if h.Server == "" {
				h.Server = cfg.Server
			}
			if host := hostOf(h.Server); host == "localhost" || net.ParseIP(host).IsLoopback() {
				fmt.Fprintf(f.IO.ErrOut, "warning: the user-data sends the host to %s, a loopback address no other host can reach; "+
					"pass --server-url with the controller URL hosts use\n", h.Server)
			}
			c, err := f.Client()
			if err != nil {
				return err
			}
			n, err := c.GetNode(cmd.Context(), h.Node)
			if err != nil {
				return err
			}
			h.NodeTags = append(append([]string{}, n.ProfileTags...), n.HardwareTags...)
			both := 0
			for _, t := range n.ProfileTags {
				if t == "gpuaas-profile-slice-vm" || t == "gpuaas-profile-baremetal" {
					both++
				}
			}
			if both > 1 {
				fmt.Fprintf(f.IO.ErrOut, "warning: %s carries both profile tags; its firmware helper will refuse and the node stays unschedulable\n", n.Name)
			}
			h.Units = map[string]string{}
			for _, name := range systemd.Names() {
				if h.Units[name], err = systemd.Unit(name); err != nil {
					return err
				}
			}
			// Only a slice-vm host enrolls: a token is minted (and audited) only for user-data
			// that carries it.
			var expires string
			if h.Profile == cloudinit.ProfileSliceVM {
				tok, err := c.NewBootstrapToken(cmd.Context(), h.Node)
				if err != nil {
					return err
				}
				h.BootstrapToken = tok.Token
				expires = tok.ExpiresAt.UTC().Format("2006-01-02 15:04Z")
			}
			ud, err := cloudinit.RenderHost(h)
			if err != nil {
				return err
			}
			_, err = f.IO.Out.Write(ud)
			if expires != "" {
				fmt.Fprintf(f.IO.ErrOut, "bootstrap token for %s expires %s\n", n.Name, expires)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&h.Profile, "profile", "", "slice-vm or baremetal (the node's gpuaas-profile-* tag)")
	fl.StringVar(&serverURL, "server-url", "", "controller URL the host uses, https://host:port (default: the one this gpuaasctl uses)")
	fl.StringVar(&h.HostdURL, "hostd-url", "", "where the host downloads gpuaas-hostd (https, or http inside the MAAS network)")
	fl.StringVar(&h.HostdSHA256, "hostd-sha256", "", "sha256 of that gpuaas-hostd binary")
	fl.StringVar(&h.FirmwareVersion, "firmware-version", "", "firmware profile version (slice-vm default: "+sliceFirmwareVersion+")")
	fl.StringVar(&h.FirmwareAttrs, "firmware-attrs", "", "expected BIOS attributes, \"BIOS.G.N=V ...\" (slice-vm default: seed 003's)")
	fl.IntVar(&h.MaxRebootAttempts, "max-reboots", 1, "controlled reboots the firmware helper may do (0..5)")
	fl.BoolVar(&noApply, "no-apply", false, "only verify the firmware profile, never stage changes")
	fl.BoolVar(&noReboot, "no-reboot", false, "stage firmware changes but leave the reboot to the operator")
	return cmd
}

// hostOf is the host name of a URL ("" when it does not parse).
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}
