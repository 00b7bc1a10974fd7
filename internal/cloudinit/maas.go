package cloudinit

import (
	"encoding/pem"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The MAAS profile intent tags and what each installs.
const (
	ProfileSliceVM   = "slice-vm"  // gpuaas-profile-slice-vm: firmware profile + hostd (libvirt runtime)
	ProfileBaremetal = "baremetal" // gpuaas-profile-baremetal: firmware profile only (MAAS deploys the tenant's OS)
)

// HostSeed is one node's MAAS deploy user-data (seed 003 "Deployed Host Bootstrap").
type HostSeed struct {
	Node           string   // node name, for messages
	Profile        string   // slice-vm | baremetal
	Server         string   // controller URL, https://host:port
	CAPEM          []byte   // the controller CA hostd pins
	BootstrapToken string   // one-time enrollment token (gpb_...); slice-vm only (baremetal hosts do not enroll)
	NodeTags       []string // the node's MAAS tags (both profile tags => the helper blocks)
	HostdURL       string   // where the host fetches gpuaas-hostd
	HostdSHA256    string   // its digest, checked before it runs
	// Firmware profile (GPUAAS_FIRMWARE_*).
	FirmwareVersion   string
	FirmwareAttrs     string // "BIOS.G.N=V BIOS.G.N=V"
	ApplyIfNeeded     bool
	RebootOnChange    bool
	MaxRebootAttempts int
	// Units are the systemd units to install (name -> text), from the systemd package.
	Units map[string]string
}

var (
	tokenRE = regexp.MustCompile(`^gpb_[A-Za-z0-9_-]{16,128}$`)
	hexRE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	tagRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	safeRE  = regexp.MustCompile(`^[A-Za-z0-9._=: -]*$`)
	fwVerRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

func (h HostSeed) validate() error {
	switch {
	case h.Profile != ProfileSliceVM && h.Profile != ProfileBaremetal:
		return fmt.Errorf("cloudinit: profile must be %s or %s", ProfileSliceVM, ProfileBaremetal)
	case h.Profile == ProfileSliceVM && !tokenRE.MatchString(h.BootstrapToken):
		return fmt.Errorf("cloudinit: %q is not a bootstrap token", h.BootstrapToken)
	case h.Profile == ProfileBaremetal && h.BootstrapToken != "":
		return fmt.Errorf("cloudinit: a baremetal host does not enroll: its user-data carries no bootstrap token")
	case !hexRE.MatchString(h.HostdSHA256):
		return fmt.Errorf("cloudinit: the gpuaas-hostd sha256 must be 64 lowercase hex digits")
	case !fwVerRE.MatchString(h.FirmwareVersion) || !safeRE.MatchString(h.FirmwareAttrs) || h.FirmwareAttrs == "":
		return fmt.Errorf("cloudinit: firmware version %q / attributes %q are not safe values", h.FirmwareVersion, h.FirmwareAttrs)
	case h.MaxRebootAttempts < 0 || h.MaxRebootAttempts > 5:
		return fmt.Errorf("cloudinit: max reboot attempts must be 0..5")
	}
	for _, raw := range []string{h.Server, h.HostdURL} {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || (u.Scheme != "https" && !(raw == h.HostdURL && u.Scheme == "http")) || strings.ContainsAny(raw, " '\"`$\\\n") {
			return fmt.Errorf("cloudinit: %q is not a plain https URL", raw)
		}
	}
	if blk, _ := pem.Decode(h.CAPEM); blk == nil || blk.Type != "CERTIFICATE" {
		return fmt.Errorf("cloudinit: the controller CA is not a PEM certificate")
	}
	for _, t := range h.NodeTags {
		if !tagRE.MatchString(t) {
			return fmt.Errorf("cloudinit: tag %q", t)
		}
	}
	return nil
}

func b01(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// RenderHost renders the MAAS deploy user-data: the controller CA, the profile environment,
// the systemd units, then (runcmd) fetch gpuaas-hostd and check its digest, run the firmware
// profile helper's unit, and for slice hosts enroll with the one-time token and start hostd.
func RenderHost(h HostSeed) ([]byte, error) {
	if err := h.validate(); err != nil {
		return nil, err
	}
	tag := "gpuaas-profile-" + h.Profile
	fw := fmt.Sprintf("GPUAAS_FIRMWARE_PROFILE_TAG=%s\nGPUAAS_FIRMWARE_PROFILE_VERSION=%s\nGPUAAS_FIRMWARE_APPLY_IF_NEEDED=%s\nGPUAAS_FIRMWARE_REBOOT_ON_CHANGE=%s\nGPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS=%d\nGPUAAS_FIRMWARE_EXPECTED_BIOS_ATTRS=\"%s\"\nGPUAAS_NODE_TAGS=%s\n",
		tag, h.FirmwareVersion, b01(h.ApplyIfNeeded), b01(h.RebootOnChange), h.MaxRebootAttempts, h.FirmwareAttrs, strings.Join(h.NodeTags, ","))
	files := []any{
		map[string]any{"path": "/etc/gpuaas/ca.crt", "permissions": "0644", "owner": "root:root", "content": string(h.CAPEM)},
		map[string]any{"path": "/etc/gpuaas/firmware-profile.env", "permissions": "0600", "owner": "root:root", "content": fw},
	}
	want := map[string]bool{"gpuaas-firmware-profile.service": true}
	if h.Profile == ProfileSliceVM {
		want["gpuaas-hostd.service"], want["gpuaas-host-bootstrap.service"] = true, true
		files = append(files, map[string]any{"path": "/etc/gpuaas/hostd.env", "permissions": "0600", "owner": "root:root",
			"content": "GPUAAS_NODE_TAGS=" + strings.Join(h.NodeTags, ",") + "\n"})
	}
	names := make([]string, 0, len(h.Units))
	for n := range h.Units {
		if want[n] {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) != len(want) {
		return nil, fmt.Errorf("cloudinit: missing systemd units (have %d of %d)", len(names), len(want))
	}
	for _, n := range names {
		files = append(files, map[string]any{"path": "/etc/systemd/system/" + n, "permissions": "0644", "owner": "root:root", "content": h.Units[n]})
	}
	runcmd := []any{
		[]string{"sh", "-c", "curl -fsSL --retry 5 -o /usr/local/bin/gpuaas-hostd.new " + shq(h.HostdURL) +
			" && echo " + shq(h.HostdSHA256+"  /usr/local/bin/gpuaas-hostd.new") + " | sha256sum -c - && chmod 0755 /usr/local/bin/gpuaas-hostd.new && mv /usr/local/bin/gpuaas-hostd.new /usr/local/bin/gpuaas-hostd"},
		[]string{"systemctl", "daemon-reload"},
		// The firmware helper may reboot the node (at most GPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS);
		// it runs again at boot until verified, then disables itself.
		[]string{"systemctl", "enable", "gpuaas-firmware-profile.service"},
		[]string{"systemctl", "start", "--no-block", "gpuaas-firmware-profile.service"},
	}
	if h.Profile == ProfileSliceVM {
		runcmd = append(runcmd,
			// The host bootstrap (packages, IOMMU arguments, vfio, OVS bridge); it may ask for
			// a reboot, which hostd reports until it happens.
			[]string{"systemctl", "enable", "gpuaas-host-bootstrap.service"},
			[]string{"systemctl", "start", "gpuaas-host-bootstrap.service"},
			[]string{"gpuaas-hostd", "enroll", "--server", h.Server, "--ca-file", "/etc/gpuaas/ca.crt", "--token", h.BootstrapToken,
				"--config", "/etc/gpuaas/hostd.yaml", "--runtime", "libvirt"},
			[]string{"systemctl", "enable", "--now", "gpuaas-hostd.service"})
	}
	cfg := map[string]any{"write_files": files, "runcmd": runcmd, "packages": []string{"curl"}}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	secret := "# Holds a one-time enrollment token: treat as a secret until the host has enrolled.\n"
	if h.Profile == ProfileBaremetal {
		secret = "# Holds no enrollment token: a baremetal host runs the firmware profile helper only.\n"
	}
	head := "#cloud-config\n# gpuaas " + tag + " host bootstrap for node " + strconv.Quote(h.Node) + " (rendered by gpuaasctl nodes cloud-init).\n" + secret
	return append([]byte(head), b...), nil
}

func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
