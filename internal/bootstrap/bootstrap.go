// Package bootstrap is the deployed-host bootstrap of seed 003 ("Host Bootstrap And
// Prerequisites" in seed 001): what a slice host needs before hostd can run VMs. It plans
// first (a dry run is the default) and applies only the steps whose check fails, so a re-run
// after the reboot it asks for resumes where it stopped. Everything goes through the host
// seam: files under the host root, commands through the runner. It reports reboot_required
// rather than pretending the host is ready.
package bootstrap

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// Options describe the host's profile.
type Options struct {
	Profile      string // slice-vm (the default) or baremetal
	Bridge       string // ovsbr0
	BridgeCIDR   string // 10.100.0.1/24
	HugepagesGiB int    // 1 GiB hugepages to reserve at boot (0: none)
	// OVSDatapath "netdev" makes a userspace bridge (hosts without the OVS kernel module).
	OVSDatapath string
	// OVSDB names a private ovsdb socket (unix:/path) for ovs-vsctl; "" = the system one.
	OVSDB string
	// Only restricts the run to these steps (e.g. slice_bridge); empty = all.
	Only []string
}

// Packages a slice host needs (Debian/Ubuntu names).
var Packages = []string{"qemu-system-x86", "qemu-utils", "libvirt-daemon-system", "libvirt-clients", "ovmf",
	"openvswitch-switch", "cloud-image-utils", "rdma-core", "ibverbs-utils", "iptables"}

// Step is one bootstrap step: its check, and what applying it does.
type Step struct {
	Name     string     `json:"name"`
	Needed   bool       `json:"needed"`
	Detail   string     `json:"detail"`
	Commands [][]string `json:"commands,omitempty"`
	Files    []File     `json:"files,omitempty"`
	Reboot   bool       `json:"reboot_required,omitempty"` // takes effect only after a reboot
}

// File is a whole-file write under the host root.
type File struct {
	Path    string      `json:"path"`
	Content string      `json:"-"`
	Mode    os.FileMode `json:"mode"`
}

// Report is a plan or its result.
type Report struct {
	Profile        string    `json:"profile"`
	Applied        bool      `json:"applied"`
	Steps          []Step    `json:"steps"`
	RebootRequired bool      `json:"reboot_required"`
	Ready          bool      `json:"ready"` // nothing needed and no reboot pending
	At             time.Time `json:"at"`
	Errors         []string  `json:"errors,omitempty"`
}

// Bootstrapper plans and applies on one host.
type Bootstrapper struct {
	FS  hostfs.FS
	Run hostfs.Runner
	Now func() time.Time
}

const (
	stateDir     = "/var/lib/gpuaas/site-bootstrap"
	rebootMarker = "/var/lib/gpuaas/site-bootstrap/h200-slice-vm.reboot-required"
	modulesFile  = "/etc/modules-load.d/gpuaas-vfio.conf"
	sysctlFile   = "/etc/sysctl.d/60-gpuaas.conf"
	grubFile     = "/etc/default/grub"
)

var (
	cidrRE   = regexp.MustCompile(`^(\d{1,3}\.){3}\d{1,3}/\d{1,2}$`)
	bridgeRE = regexp.MustCompile(`^[a-z0-9-]{1,15}$`)
	ovsdbRE  = regexp.MustCompile(`^unix:/[A-Za-z0-9/._-]+$`)
)

// Plan checks every step and says what applying would do. It changes nothing.
func (b Bootstrapper) Plan(ctx context.Context, o Options) (Report, error) {
	if o.Profile == "" {
		o.Profile = "slice-vm"
	}
	if o.Bridge == "" {
		o.Bridge = "ovsbr0"
	}
	if o.BridgeCIDR == "" {
		o.BridgeCIDR = "10.100.0.1/24"
	}
	switch {
	case o.Profile != "slice-vm" && o.Profile != "baremetal":
		return Report{}, fmt.Errorf("bootstrap: profile must be slice-vm or baremetal")
	case !cidrRE.MatchString(o.BridgeCIDR) || !bridgeRE.MatchString(o.Bridge):
		return Report{}, fmt.Errorf("bootstrap: bridge %q / %q", o.Bridge, o.BridgeCIDR)
	case o.HugepagesGiB < 0 || o.HugepagesGiB > 4096:
		return Report{}, fmt.Errorf("bootstrap: hugepages must be 0..4096 GiB")
	}
	r := Report{Profile: o.Profile, At: b.now()}
	if o.Profile == "baremetal" {
		// A baremetal host is the tenant's: nothing of the slice runtime is installed.
		r.Ready = true
		return r, nil
	}
	if o.OVSDatapath != "" && o.OVSDatapath != "netdev" && o.OVSDatapath != "system" {
		return Report{}, fmt.Errorf("bootstrap: OVS datapath must be system or netdev")
	}
	if o.OVSDB != "" && !ovsdbRE.MatchString(o.OVSDB) {
		return Report{}, fmt.Errorf("bootstrap: OVS database %q must be unix:/path", o.OVSDB)
	}
	only := map[string]bool{}
	for _, n := range o.Only {
		only[n] = true
	}
	for _, s := range []func() Step{func() Step { return b.packages(ctx) }, func() Step { return b.kernelArgs(o) }, b.vfioModules,
		func() Step { return b.bridge(o) }, func() Step { return b.nvidia(ctx) }, b.libvirtDir, b.staleDnsmasq} {
		st := s()
		if len(only) == 0 || only[st.Name] {
			r.Steps = append(r.Steps, st)
		}
	}
	if len(only) > 0 && len(r.Steps) != len(only) {
		return Report{}, fmt.Errorf("bootstrap: unknown step in %v (steps: packages kernel_args vfio_modules slice_bridge nvidia_services libvirt_dir stale_dnsmasq)", o.Only)
	}
	if b.FS.Exists(rebootMarker) && !b.cmdlineHas("iommu=pt") {
		r.RebootRequired = true // applied earlier, not rebooted yet
	}
	for _, s := range r.Steps {
		if s.Needed && s.Reboot {
			r.RebootRequired = true
		}
	}
	r.Ready = !r.RebootRequired
	for _, s := range r.Steps {
		if s.Needed {
			r.Ready = false
		}
	}
	return r, nil
}

func (b Bootstrapper) now() time.Time {
	if b.Now != nil {
		return b.Now().UTC()
	}
	return time.Now().UTC()
}

func (b Bootstrapper) packages(ctx context.Context) Step {
	s := Step{Name: "packages"}
	var missing []string
	for _, p := range Packages {
		out, err := b.Run.Run(ctx, "dpkg-query", "-W", "-f=${Status}", p)
		if err != nil || !strings.Contains(string(out), "install ok installed") {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		s.Detail = "all installed"
		return s
	}
	s.Needed, s.Detail = true, "missing: "+strings.Join(missing, " ")
	s.Commands = [][]string{{"apt-get", "update", "-q"}, append([]string{"apt-get", "install", "-y", "-q", "--no-install-recommends"}, missing...)}
	return s
}

func (b Bootstrapper) cmdlineHas(arg string) bool {
	c, _ := b.FS.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(c)) {
		if f == arg {
			return true
		}
	}
	return false
}

// kernelArgs adds the IOMMU (and hugepage) arguments to GRUB_CMDLINE_LINUX_DEFAULT.
func (b Bootstrapper) kernelArgs(o Options) Step {
	s := Step{Name: "kernel_args", Reboot: true}
	cpu, _ := b.FS.ReadFile("/proc/cpuinfo")
	want := []string{"intel_iommu=on", "iommu=pt"}
	if strings.Contains(string(cpu), "AuthenticAMD") {
		want = []string{"amd_iommu=on", "iommu=pt"}
	}
	if o.HugepagesGiB > 0 {
		want = append(want, "default_hugepagesz=1G", "hugepagesz=1G", "hugepages="+strconv.Itoa(o.HugepagesGiB))
	}
	grub, err := b.FS.ReadFile(grubFile)
	if err != nil {
		s.Needed, s.Detail = true, grubFile+" is unreadable: set the kernel arguments "+strings.Join(want, " ")+" by hand"
		return s
	}
	lines := strings.Split(string(grub), "\n")
	idx, cur := -1, ""
	for i, l := range lines {
		if v, ok := strings.CutPrefix(l, "GRUB_CMDLINE_LINUX_DEFAULT="); ok {
			idx, cur = i, strings.Trim(v, `"`)
		}
	}
	have := map[string]bool{}
	for _, f := range strings.Fields(cur) {
		have[f] = true
	}
	var add []string
	for _, w := range want {
		if !have[w] {
			add = append(add, w)
		}
	}
	if len(add) == 0 {
		s.Detail = "GRUB has " + strings.Join(want, " ")
		return s
	}
	line := `GRUB_CMDLINE_LINUX_DEFAULT="` + strings.TrimSpace(cur+" "+strings.Join(add, " ")) + `"`
	if idx < 0 {
		lines = append(lines, line)
	} else {
		lines[idx] = line
	}
	s.Needed, s.Detail = true, "add "+strings.Join(add, " ")+" to GRUB_CMDLINE_LINUX_DEFAULT"
	s.Files = []File{{Path: grubFile, Content: strings.Join(lines, "\n"), Mode: 0o644}}
	s.Commands = [][]string{{"update-grub"}}
	return s
}

func (b Bootstrapper) wantFile(name, path, content string, mode os.FileMode, detail string) Step {
	s := Step{Name: name}
	cur, err := b.FS.ReadFile(path)
	if err == nil && string(cur) == content {
		s.Detail = path + " in place"
		return s
	}
	s.Needed, s.Detail = true, detail
	s.Files = []File{{Path: path, Content: content, Mode: mode}}
	return s
}

func (b Bootstrapper) vfioModules() Step {
	s := b.wantFile("vfio_modules", modulesFile, "# gpuaas: GPUs and fabric VFs are passed through with vfio-pci\nvfio\nvfio_iommu_type1\nvfio_pci\n", 0o644,
		"load vfio, vfio_iommu_type1 and vfio_pci at boot")
	if s.Needed {
		s.Commands = [][]string{{"modprobe", "-a", "vfio", "vfio_iommu_type1", "vfio_pci"}}
	}
	return s
}

// bridge is the slice bridge with NAT for the VMs' management network (seed 000 networking).
func (b Bootstrapper) bridge(o Options) Step {
	s := Step{Name: "slice_bridge"}
	ip, _, _ := strings.Cut(o.BridgeCIDR, "/")
	parts := strings.Split(ip, ".")
	subnet := strings.Join(parts[:3], ".") + ".0/" + strings.SplitN(o.BridgeCIDR, "/", 2)[1]
	sysctl, _ := b.FS.ReadFile(sysctlFile)
	if b.FS.Exists("/sys/class/net/"+o.Bridge) && strings.Contains(string(sysctl), "net.ipv4.ip_forward = 1") {
		s.Detail = o.Bridge + " exists; forwarding on"
		return s
	}
	s.Needed, s.Detail = true, "create the OVS bridge "+o.Bridge+" "+o.BridgeCIDR+" with NAT for "+subnet
	s.Files = []File{{Path: sysctlFile, Content: "# gpuaas: slice VMs reach the outside through NAT on the host\nnet.ipv4.ip_forward = 1\n", Mode: 0o644}}
	vsctl := []string{"ovs-vsctl"}
	if o.OVSDB != "" {
		vsctl = append(vsctl, "--db="+o.OVSDB)
	}
	addBr := append(append([]string{}, vsctl...), "--may-exist", "add-br", o.Bridge)
	if o.OVSDatapath != "" {
		addBr = append(addBr, "--", "set", "bridge", o.Bridge, "datapath_type="+o.OVSDatapath)
	}
	s.Commands = [][]string{
		addBr,
		{"ip", "addr", "replace", o.BridgeCIDR, "dev", o.Bridge},
		{"ip", "link", "set", o.Bridge, "up"},
		{"sysctl", "-p", sysctlFile},
		{"sh", "-c", "iptables -t nat -C POSTROUTING -s " + subnet + " ! -d " + subnet + " -j MASQUERADE 2>/dev/null || iptables -t nat -A POSTROUTING -s " + subnet + " ! -d " + subnet + " -j MASQUERADE"},
	}
	return s
}

// nvidia stops the host NVIDIA services that would hold GPUs meant for vfio-pci.
func (b Bootstrapper) nvidia(ctx context.Context) Step {
	s := Step{Name: "nvidia_services"}
	var active []string
	for _, u := range []string{"nvidia-persistenced.service", "nvidia-fabricmanager.service"} {
		if out, err := b.Run.Run(ctx, "systemctl", "is-enabled", u); err == nil && strings.TrimSpace(string(out)) == "enabled" {
			active = append(active, u)
		}
	}
	if len(active) == 0 {
		s.Detail = "no host NVIDIA service enabled"
		return s
	}
	s.Needed, s.Detail = true, "disable "+strings.Join(active, " ")+" (slice GPUs belong to vfio-pci)"
	s.Commands = [][]string{append([]string{"systemctl", "disable", "--now"}, active...)}
	return s
}

func (b Bootstrapper) libvirtDir() Step {
	s := Step{Name: "libvirt_dir"}
	p, err := b.FS.Path("/var/lib/libvirt")
	if err == nil {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm() == 0o755 {
			s.Detail = "/var/lib/libvirt is 0755"
			return s
		}
	}
	s.Needed, s.Detail = true, "make /var/lib/libvirt 0755 (QEMU reaches the NVRAM and seed files)"
	s.Commands = [][]string{{"install", "-d", "-m", "0755", "/var/lib/libvirt"}}
	return s
}

// staleDnsmasq removes per-VM dnsmasq reservations of the prototype: hostd serves DHCP itself.
func (b Bootstrapper) staleDnsmasq() Step {
	s := Step{Name: "stale_dnsmasq"}
	matches, _ := b.FS.Glob("/etc/dnsmasq.d/gpuaas-*.conf")
	if len(matches) == 0 {
		s.Detail = "none"
		return s
	}
	sort.Strings(matches)
	s.Needed, s.Detail = true, "remove "+strings.Join(matches, " ")+" (hostd's DHCP server owns reservations)"
	s.Commands = [][]string{append([]string{"rm", "-f"}, matches...)}
	return s
}

// Apply runs the needed steps in order (files first, then commands), records the result under
// /var/lib/gpuaas/site-bootstrap/, and leaves the reboot marker when a reboot is needed. A
// failing step stops the run; the next run plans again and resumes.
func (b Bootstrapper) Apply(ctx context.Context, o Options) (Report, error) {
	r, err := b.Plan(ctx, o)
	if err != nil {
		return r, err
	}
	r.Applied = true
	for _, s := range r.Steps {
		if !s.Needed {
			continue
		}
		if err := b.applyStep(ctx, s); err != nil {
			r.Errors = append(r.Errors, s.Name+": "+err.Error())
			_ = b.record(r)
			return r, fmt.Errorf("bootstrap step %s: %w", s.Name, err)
		}
		if s.Reboot {
			if err := b.writeFile(File{Path: rebootMarker, Content: r.At.Format(time.RFC3339) + " " + s.Name + "\n", Mode: 0o644}); err != nil {
				return r, err
			}
		}
	}
	if !r.RebootRequired && b.FS.Exists(rebootMarker) {
		if p, err := b.FS.Path(rebootMarker); err == nil {
			_ = os.Remove(p) // rebooted with the new arguments: the marker is stale
		}
	}
	r.Ready = !r.RebootRequired
	for _, s := range r.Steps {
		if s.Needed && !s.Reboot {
			r.Ready = false // a step just ran: the next plan confirms it
		}
	}
	return r, b.record(r)
}

func (b Bootstrapper) applyStep(ctx context.Context, s Step) error {
	for _, f := range s.Files {
		if err := b.writeFile(f); err != nil {
			return err
		}
	}
	for _, c := range s.Commands {
		if _, err := b.Run.Run(ctx, c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

func (b Bootstrapper) writeFile(f File) error {
	p, err := b.FS.Path(f.Path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".gpuaas-tmp"
	if err := os.WriteFile(tmp, []byte(f.Content), f.Mode); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func (b Bootstrapper) record(r Report) error {
	bs, _ := json.MarshalIndent(r, "", "  ")
	return b.writeFile(File{Path: stateDir + "/last-run.json", Content: string(bs) + "\n", Mode: 0o644})
}
