// Package cloudinit renders a slice VM's NoCloud seed — user-data, meta-data and
// network-config — and writes the seed ISO (ISO 9660, volume id "cidata") itself, so hosts
// need no cloud-localds. Inputs are validated: an SSH key or hostname cannot inject YAML.
package cloudinit

import (
	"bytes"
	_ "embed"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/kdomanski/iso9660"
	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/ssh"
)

// Seed describes one slice VM's first boot.
type Seed struct {
	InstanceID    string   // the allocation id
	Hostname      string   // e.g. gpuaas-<short id>
	Username      string   // the image's default user
	SSHPublicKeys []string // tenant keys, OpenSSH authorized_keys lines
	TerminalKey   string   // the host relay's public key (gpuaas terminal)
	MAC           string   // boot NIC MAC
	IP            string   // private IP (DHCP reservation; also written for reference)
	// TelemetryToken is the per-allocation token the guest helper uses.
	TelemetryToken string
	ReadyMarker    string // file the guest writes when boot finished (default /var/lib/gpuaas/slice-ready)
	// TelemetryURL is where the guest helper POSTs (http://<bridge address>:9110/internal/v1/guest-telemetry);
	// empty: no helper is installed.
	TelemetryURL string
	// GuestDriverProfile names a driver install (DriverProfiles) run at first boot; empty: none.
	GuestDriverProfile string
	// Validation makes the guest a burn-in validation VM: the validation script (it needs
	// TelemetryURL) runs once at first boot and reports its results through telemetry.
	Validation bool
}

// DriverProfile is a guest driver install: packages plus commands run after them.
type DriverProfile struct {
	Packages []string
	Runcmd   [][]string
}

// DriverProfiles are the guest driver installs a SKU profile may name (guest_driver_profile).
var DriverProfiles = map[string]DriverProfile{
	"ubuntu_24_04_nvidia_570_server_rdma": {
		Packages: []string{"nvidia-driver-570-server", "nvidia-utils-570-server", "nvidia-fabricmanager-570", "rdma-core", "ibverbs-utils", "infiniband-diags"},
		Runcmd:   [][]string{{"systemctl", "enable", "--now", "nvidia-fabricmanager"}, {"modprobe", "nvidia"}},
	},
	"ubuntu_24_04_rocm_6_rdma": {
		Packages: []string{"rdma-core", "ibverbs-utils"},
		Runcmd:   [][]string{{"sh", "-c", "apt-get install -y amdgpu-dkms rocm-smi-lib || true"}},
	},
}

// telemetryHelper is the guest side of guest telemetry: every minute it POSTs a small JSON
// snapshot (load, memory, GPUs when nvidia-smi exists) and the GPUs' health readings (Xid
// codes from the kernel log, volatile uncorrectable ECC counts) with the per-allocation token.
//
//go:embed metrics-helper.sh
var telemetryHelper string

// validateScript is the burn-in validation run in a validation VM (Seed.Validation).
//
//go:embed validate.sh
var validateScript string

// ValidateFile is the validation script's name on the seed volume: a guest without
// cloud-init (the lab's test guest) runs it from there; cloud-init images get it through
// write_files and runcmd.
const ValidateFile = "validate"

// validation renders the validation script with the instance's identity and telemetry
// channel (all checked by Validate to be inert in a shell word).
func (s Seed) validation() string {
	return strings.NewReplacer("@ID@", s.InstanceID, "@TOKEN@", s.TelemetryToken, "@URL@", s.TelemetryURL).Replace(validateScript)
}

var (
	hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	userRE     = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	macRE      = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	idRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	// urlRE: the telemetry URL lands in a file the guest helper sources with sh, so only
	// characters that are inert unquoted in a shell assignment.
	urlRE    = regexp.MustCompile(`^https?://[A-Za-z0-9._~:/?=%@+,\[\]-]+$`)
	markerRE = regexp.MustCompile(`^(/[A-Za-z0-9_][A-Za-z0-9._-]*)+$`)
)

// Validate checks every field that ends up in the seed.
func (s Seed) Validate() error {
	if !idRE.MatchString(s.InstanceID) {
		return fmt.Errorf("cloudinit: instance id %q is not a safe identifier", s.InstanceID)
	}
	if !hostnameRE.MatchString(s.Hostname) {
		return fmt.Errorf("cloudinit: hostname %q is not a valid DNS label", s.Hostname)
	}
	if !userRE.MatchString(s.Username) {
		return fmt.Errorf("cloudinit: username %q is not a valid login name", s.Username)
	}
	if !macRE.MatchString(s.MAC) {
		return fmt.Errorf("cloudinit: MAC %q must be lowercase aa:bb:cc:dd:ee:ff", s.MAC)
	}
	keys := append(append([]string{}, s.SSHPublicKeys...), s.TerminalKey)
	for i, k := range keys {
		if k == "" && i == len(keys)-1 {
			continue // no terminal key is allowed (terminal disabled)
		}
		if strings.ContainsAny(k, "\r\n") {
			return fmt.Errorf("cloudinit: ssh key %d spans lines", i)
		}
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			return fmt.Errorf("cloudinit: ssh key %d: %w", i, err)
		}
	}
	if s.TelemetryToken != "" && !idRE.MatchString(s.TelemetryToken) {
		return fmt.Errorf("cloudinit: telemetry token is not a safe token")
	}
	if s.TelemetryURL != "" {
		u, err := url.Parse(s.TelemetryURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !urlRE.MatchString(s.TelemetryURL) {
			return fmt.Errorf("cloudinit: telemetry URL %q is not a plain http(s) URL", s.TelemetryURL)
		}
	}
	if s.ReadyMarker != "" && (!markerRE.MatchString(s.ReadyMarker) || strings.Contains(s.ReadyMarker, "..")) {
		return fmt.Errorf("cloudinit: ready marker %q must be a plain absolute path", s.ReadyMarker)
	}
	if s.Validation && (s.TelemetryURL == "" || s.TelemetryToken == "") {
		return fmt.Errorf("cloudinit: a validation VM needs the telemetry URL and token to report through")
	}
	if s.GuestDriverProfile != "" {
		if _, ok := DriverProfiles[s.GuestDriverProfile]; !ok {
			names := make([]string, 0, len(DriverProfiles))
			for n := range DriverProfiles {
				names = append(names, n)
			}
			sort.Strings(names)
			return fmt.Errorf("cloudinit: unknown guest_driver_profile %q (known: %s)", s.GuestDriverProfile, strings.Join(names, ", "))
		}
	}
	return nil
}

// Files are the rendered NoCloud documents.
type Files struct {
	UserData      []byte
	MetaData      []byte
	NetworkConfig []byte
	// Validate is the validation script of a validation VM (nil otherwise), written to the
	// seed volume as ValidateFile.
	Validate []byte
}

// documents are the files of the seed volume.
func (f Files) documents() map[string][]byte {
	docs := map[string][]byte{"user-data": f.UserData, "meta-data": f.MetaData, "network-config": f.NetworkConfig}
	if f.Validate != nil {
		docs[ValidateFile] = f.Validate
	}
	return docs
}

// Render produces user-data (#cloud-config), meta-data and network-config (v2). YAML is
// produced by a marshaller, never by string pasting, so values cannot inject keys.
func Render(s Seed) (Files, error) {
	if err := s.Validate(); err != nil {
		return Files{}, err
	}
	marker := s.ReadyMarker
	if marker == "" {
		marker = "/var/lib/gpuaas/slice-ready"
	}
	keys := append([]string{}, s.SSHPublicKeys...)
	if s.TerminalKey != "" {
		keys = append(keys, s.TerminalKey)
	}
	user := map[string]any{
		"name": s.Username, "groups": []string{"sudo"}, "shell": "/bin/bash",
		"sudo": "ALL=(ALL) NOPASSWD:ALL", "lock_passwd": true, "ssh_authorized_keys": keys,
	}
	cfg := map[string]any{
		"hostname":          s.Hostname,
		"preserve_hostname": false,
		"users":             []any{"default", user},
		"ssh_pwauth":        false,
		"disable_root":      true,
	}
	env := fmt.Sprintf("GPUAAS_INSTANCE_ID=%s\nGPUAAS_TELEMETRY_TOKEN=%s\nGPUAAS_TELEMETRY_URL=%s\n", s.InstanceID, s.TelemetryToken, s.TelemetryURL)
	files := []any{map[string]any{"path": "/etc/gpuaas/instance.env", "permissions": "0600", "owner": "root:root", "content": env}}
	var runcmd []any
	if s.TelemetryURL != "" {
		files = append(files,
			map[string]any{"path": "/usr/local/bin/gpuaas-metrics-helper", "permissions": "0755", "owner": "root:root", "content": telemetryHelper},
			map[string]any{"path": "/etc/systemd/system/gpuaas-metrics-helper.service", "permissions": "0644", "owner": "root:root",
				"content": "[Unit]\nDescription=gpuaas guest telemetry snapshot\n\n[Service]\nType=oneshot\nExecStart=/usr/local/bin/gpuaas-metrics-helper\n"},
			map[string]any{"path": "/etc/systemd/system/gpuaas-metrics-helper.timer", "permissions": "0644", "owner": "root:root",
				"content": "[Unit]\nDescription=gpuaas guest telemetry every minute\n\n[Timer]\nOnBootSec=30s\nOnUnitActiveSec=60s\n\n[Install]\nWantedBy=timers.target\n"})
		runcmd = append(runcmd, []string{"sh", "-c", "command -v systemctl >/dev/null && systemctl daemon-reload && systemctl enable --now gpuaas-metrics-helper.timer || true"})
	}
	if s.GuestDriverProfile != "" {
		dp := DriverProfiles[s.GuestDriverProfile]
		cfg["package_update"] = true
		cfg["packages"] = dp.Packages
		for _, c := range dp.Runcmd {
			runcmd = append(runcmd, c)
		}
	}
	if s.Validation {
		files = append(files, map[string]any{"path": "/usr/local/bin/gpuaas-validate", "permissions": "0700", "owner": "root:root", "content": s.validation()})
		runcmd = append(runcmd, []string{"sh", "/usr/local/bin/gpuaas-validate"})
	}
	// Last: the readiness marker says first boot (and any driver install) finished.
	runcmd = append(runcmd, []string{"sh", "-c", "mkdir -p " + filepath.Dir(marker) + " && date -u +%FT%TZ > " + marker})
	cfg["write_files"], cfg["runcmd"] = files, runcmd
	ud, err := yaml.Marshal(cfg)
	if err != nil {
		return Files{}, err
	}
	md, err := yaml.Marshal(map[string]any{"instance-id": s.InstanceID, "local-hostname": s.Hostname})
	if err != nil {
		return Files{}, err
	}
	nc, err := yaml.Marshal(map[string]any{"version": 2, "ethernets": map[string]any{
		"eth0": map[string]any{"match": map[string]string{"macaddress": s.MAC}, "set-name": "eth0", "dhcp4": true},
	}})
	if err != nil {
		return Files{}, err
	}
	out := Files{UserData: append([]byte("#cloud-config\n"), ud...), MetaData: md, NetworkConfig: nc}
	if s.Validation {
		out.Validate = []byte(s.validation())
	}
	return out, nil
}

// WriteSeedDir writes the three documents (0600) into dir, created 0700.
func WriteSeedDir(dir string, f Files) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, b := range f.documents() {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// WriteISO writes the NoCloud seed ISO (volume id "cidata") to path (0644: QEMU reads it).
func WriteISO(path string, f Files) error {
	w, err := iso9660.NewWriter()
	if err != nil {
		return fmt.Errorf("cloudinit: iso: %w", err)
	}
	defer w.Cleanup() //nolint:errcheck // temp staging only
	for name, b := range f.documents() {
		if err := w.AddFile(bytes.NewReader(b), name); err != nil {
			return fmt.Errorf("cloudinit: iso: %w", err)
		}
	}
	tmp := path + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := w.WriteTo(out, "cidata"); err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("cloudinit: iso: %w", err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
