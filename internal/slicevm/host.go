package slicevm

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/internal/cloudinit"
	"github.com/gpuaas/gpuaas/internal/dhcpd"
	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/domainxml"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/imagecache"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/telemetry"
)

// ReadyMarker is the file the guest writes when its first boot finished (seed 001 gate).
const ReadyMarker = "/var/lib/gpuaas/slice-ready"

// HostConfig is the Host runtime's view of the machine.
type HostConfig struct {
	// Lab runs the production code under software emulation (domain type qemu): loop devices
	// stand in for NVMe, a Linux bridge for OVS, and the phases that need PCI passthrough say
	// "skipped: lab host" (never "ok").
	Lab bool
	// DataDir is /var/lib/gpuaas: slices/, slice-images/, node-scheduler/leases/, terminal/.
	DataDir string
	// FS is the real host (root "/"); Run runs host commands (qemu-img, wipe tools).
	FS  hostfs.FS
	Run hostfs.Runner
	// Hypervisor is libvirt on the local socket.
	Hypervisor hypervisor.Hypervisor
	Leases     *leases.Dir
	Images     *imagecache.Cache
	DHCP       *dhcpd.Server
	Telemetry  *telemetry.Registry
	// Bridge is the slice bridge (ovsbr0 in production); OVS says whether it is Open vSwitch.
	Bridge string
	OVS    bool
	// LoaderPath and VarsTemplate are the OVMF code and variable-store template.
	LoaderPath   string
	VarsTemplate string
	// TerminalKeyPath is the host relay key (GPUAAS_SLICE_TERMINAL_SSH_KEY_PATH).
	TerminalKeyPath string
	// VFIOBind allows rebinding a GPU or VF to vfio-pci (GPUAAS_SLICE_RUNTIME_VFIO_BIND=1);
	// without it a wrong driver is a hard error.
	VFIOBind bool
	// ReadinessTimeout bounds the readiness gate when the profile gives none (default 120 s).
	ReadinessTimeout time.Duration
	// GuestSSHPort is the guest's SSH port (22).
	GuestSSHPort int
	// LibvirtSocket is where a console session opens its own libvirt connection.
	LibvirtSocket string
	// TelemetryURL is the guest telemetry endpoint as guests reach it (set once listening).
	TelemetryURL string
	Log          *slog.Logger
}

// Host is the libvirt runtime (and, with Lab set, the lab runtime).
type Host struct {
	cfg  HostConfig
	mu   sync.Mutex
	turl string
	busy map[string]int // allocation id -> provisions and releases running here
}

// SetTelemetryURL records where guests reach the telemetry endpoint (known once it listens).
func (h *Host) SetTelemetryURL(u string) {
	h.mu.Lock()
	h.turl = u
	h.mu.Unlock()
}

func (h *Host) telemetryURL() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.turl != "" {
		return h.turl
	}
	return h.cfg.TelemetryURL
}

// NewHost checks the configuration and fills defaults.
func NewHost(cfg HostConfig) (*Host, error) {
	switch {
	case cfg.DataDir == "" || !filepath.IsAbs(cfg.DataDir):
		return nil, fmt.Errorf("slicevm: data dir %q must be absolute", cfg.DataDir)
	case cfg.Hypervisor == nil || cfg.Leases == nil || cfg.Images == nil || cfg.DHCP == nil || cfg.Telemetry == nil || cfg.Run == nil:
		return nil, errors.New("slicevm: host runtime needs hypervisor, leases, image cache, DHCP server, telemetry and a command runner")
	case cfg.Bridge == "":
		return nil, errors.New("slicevm: no slice bridge configured")
	}
	if cfg.TerminalKeyPath == "" {
		cfg.TerminalKeyPath = filepath.Join(cfg.DataDir, "terminal", "id_ed25519")
	}
	if cfg.ReadinessTimeout <= 0 {
		cfg.ReadinessTimeout = 120 * time.Second
	}
	if cfg.GuestSSHPort == 0 {
		cfg.GuestSSHPort = 22
	}
	if cfg.LoaderPath == "" {
		cfg.LoaderPath = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	}
	if cfg.VarsTemplate == "" {
		cfg.VarsTemplate = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Host{cfg: cfg, turl: cfg.TelemetryURL, busy: map[string]int{}}, nil
}

// Name is "lab" or "libvirt".
func (h *Host) Name() string {
	if h.cfg.Lab {
		return "lab"
	}
	return "libvirt"
}

// PlanInvalidError is the node scheduler's refusal of the controller's plan (seed 004): the
// host no longer matches it (device gone, disk mounted, lease held). Reason "plan_invalid".
type PlanInvalidError struct{ Msg string }

func (e *PlanInvalidError) Error() string { return "plan_invalid: " + e.Msg }

func planInvalid(format string, a ...any) error {
	return &PlanInvalidError{Msg: fmt.Sprintf(format, a...)}
}

// ReadinessError says which stage of the readiness gate failed.
type ReadinessError struct {
	Stage   string // dhcp_lease | tcp_22 | ssh | ready_marker | nvidia_smi
	Err     error
	Console string // the tail of the guest's serial console
}

func (e *ReadinessError) Error() string {
	msg := "readiness " + e.Stage + ": " + e.Err.Error()
	if e.Console != "" {
		msg += "; console tail: " + e.Console
	}
	return msg
}
func (e *ReadinessError) Unwrap() error { return e.Err }

// SliceDir is the per-allocation directory (seed files, seed ISO, NVRAM, pinned guest host key).
func (h *Host) SliceDir(allocationID string) string {
	return filepath.Join(h.cfg.DataDir, "slices", allocationID)
}

const labSkip = "lab host: no PCI passthrough"

// Provision runs the 17 phases. Any failure runs the deferred cleanup (DHCP reservation,
// telemetry token, leases, seed dir, and a domain this attempt defined), so nothing is left
// behind; a retried task finds its own leases and a running domain and carries on.
func (h *Host) Provision(ctx context.Context, p *task.VMProvision, rec *Recorder) (task.ProvisionOutput, error) {
	out := task.ProvisionOutput{Runtime: h.Name(), VMName: VMName(p.AllocationID)}
	defer h.working(p.AllocationID)()
	if err := validatePlan(p.Bundles); err != nil {
		return out, planInvalid("%v", err)
	}
	boot := p.Bundles[0]
	out.PrivateIP = boot.PrivateIP
	dir := h.SliceDir(p.AllocationID)
	var cleanup []func()
	succeeded := false
	defer func() {
		if succeeded {
			return
		}
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	var (
		imagePath, pubKey, token string
		disks                    []string
		domXML                   []byte
		placed                   string
		alreadyRunning           bool
		signer                   ssh.Signer
		started                  time.Time
	)
	steps := []struct {
		name string
		fn   func() (string, error)
	}{
		{"lease_acquire", func() (string, error) {
			req := leases.Request{AllocationID: p.AllocationID, TaskID: rec.TaskID, Slots: map[string][]string{}}
			if req.TaskID == "" {
				req.TaskID = "untracked"
			}
			for _, b := range p.Bundles {
				req.Slots[b.SlotID] = []string{b.GPUPCI, b.FabricVFPCI, b.NVMeDevice}
			}
			ls, err := h.cfg.Leases.Acquire(req)
			if errors.Is(err, leases.ErrHeld) {
				return "", planInvalid("%v", err)
			}
			if err != nil {
				return "", err
			}
			slots := slotIDs(p.Bundles)
			cleanup = append(cleanup, func() { _, _ = h.cfg.Leases.Release(p.AllocationID, slots) })
			return fmt.Sprintf("%d slot leases until %s", len(ls), ls[0].ExpiresAt.UTC().Format(time.RFC3339)), nil
		}},
		{"host_dependencies", func() (string, error) { return h.checkDependencies() }},
		{"host_passthrough_check", func() (string, error) {
			if h.cfg.Lab {
				return "", Skip(labSkip)
			}
			if !h.cfg.FS.Exists("/dev/vfio/vfio") {
				return "", errors.New("/dev/vfio/vfio is missing: load vfio-pci (host bootstrap)")
			}
			groups, _ := h.cfg.FS.ReadDir("/sys/kernel/iommu_groups")
			if len(groups) == 0 {
				return "", errors.New("no IOMMU groups: enable VT-d/AMD-Vi and intel_iommu=on iommu=pt")
			}
			return fmt.Sprintf("%d IOMMU groups, /dev/vfio present", len(groups)), nil
		}},
		{"vfio_bind_check", func() (string, error) {
			if h.cfg.Lab {
				return "", Skip(labSkip)
			}
			return h.vfioCheck(p.Bundles)
		}},
		{"image_stat_download", func() (string, error) {
			if p.Image.SourceRef == "" {
				return "", fmt.Errorf("image %s has no source", p.Image.Slug)
			}
			var fresh bool
			var err error
			var last time.Time
			imagePath, fresh, err = h.cfg.Images.GetProgress(ctx, p.Image.SourceRef, p.Image.DigestSHA256, func(done, total int64) {
				if time.Since(last) < 2*time.Second {
					return // throttled: progress goes to the controller
				}
				last = time.Now()
				rec.Progress("image_stat_download", downloadDetail(done, total))
			})
			if err != nil {
				return "", err
			}
			fi, err := os.Stat(imagePath)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%s (%d bytes, %s)", p.Image.Slug, fi.Size(), map[bool]string{true: "downloaded", false: "cached"}[fresh]), nil
		}},
		{"image_digest_verify", func() (string, error) {
			got, err := fileSHA256(imagePath)
			if err != nil {
				return "", err
			}
			if got != p.Image.DigestSHA256 {
				_ = os.Remove(imagePath)
				return "", fmt.Errorf("%w: %s has sha256 %s, the catalog says %s", imagecache.ErrDigestMismatch, p.Image.Slug, got, p.Image.DigestSHA256)
			}
			return "sha256 " + got[:16] + "… matches the catalog", nil
		}},
		{"cloud_init_dir", func() (string, error) {
			if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
				return "", err
			}
			if err := os.Mkdir(dir, 0o711); err != nil && !os.IsExist(err) {
				return "", err
			}
			cleanup = append(cleanup, func() { _ = os.RemoveAll(dir) })
			return dir, nil
		}},
		{"terminal_key", func() (string, error) {
			var err error
			signer, pubKey, err = EnsureTerminalKey(h.cfg.TerminalKeyPath)
			if err != nil {
				return "", err
			}
			return ssh.FingerprintSHA256(signer.PublicKey()), nil
		}},
		{"guest_telemetry_register", func() (string, error) {
			// A token issued by an earlier attempt may already be in a running guest's seed:
			// it is reused, and only a token this attempt issued is revoked if it fails.
			had := h.cfg.Telemetry.Has(p.AllocationID)
			var err error
			if token, err = h.cfg.Telemetry.Register(p.AllocationID); err != nil {
				return "", err
			}
			if had {
				return "per-allocation token kept (issued by an earlier attempt)", nil
			}
			cleanup = append(cleanup, func() { _ = h.cfg.Telemetry.Unregister(p.AllocationID) })
			return "per-allocation token issued", nil
		}},
		{"cloud_init_seed_files", func() (string, error) {
			f, err := cloudinit.Render(cloudinit.Seed{InstanceID: p.AllocationID, Hostname: hostname(p.AllocationID),
				Username: p.Image.Username, SSHPublicKeys: p.SSHPublicKeys, TerminalKey: pubKey, MAC: boot.MACAddress,
				IP: boot.PrivateIP, TelemetryToken: token, ReadyMarker: ReadyMarker, TelemetryURL: h.telemetryURL(),
				GuestDriverProfile: p.Profile.GuestDriverProfile})
			if err != nil {
				return "", err
			}
			if err := cloudinit.WriteSeedDir(dir, f); err != nil {
				return "", err
			}
			return fmt.Sprintf("user-data %d B, %d tenant keys + relay key", len(f.UserData), len(p.SSHPublicKeys)), cloudinit.WriteISO(filepath.Join(dir, ".pending.iso"), f)
		}},
		{"seed_iso", func() (string, error) {
			iso := filepath.Join(dir, "seed.iso")
			if err := os.Rename(filepath.Join(dir, ".pending.iso"), iso); err != nil {
				return "", err
			}
			return iso, os.Chmod(iso, 0o644) // QEMU (an unprivileged user) reads it
		}},
		{"runtime_validate", func() (string, error) {
			if !h.cfg.FS.Exists("/sys/class/net/" + h.cfg.Bridge) {
				return "", planInvalid("slice bridge %s does not exist", h.cfg.Bridge)
			}
			var err error
			st, serr := h.cfg.Hypervisor.State(out.VMName)
			switch {
			case serr != nil:
				return "", fmt.Errorf("domain %s: %w", out.VMName, serr)
			case st == hypervisor.Running:
				alreadyRunning = true // adopted: its disk is in use, it is not written or defined again
			case st != hypervisor.NotFound:
				// Left by an attempt killed between define and a running guest (defined but never
				// started, paused, shutting down): this allocation's own domain, not yet handed to
				// its tenant. Remove it, so this attempt writes the disk with nothing attached and
				// defines the domain afresh (define would refuse the name under a new UUID).
				h.destroyAndUndefine(out.VMName)
				if st2, err := h.cfg.Hypervisor.State(out.VMName); err != nil || st2 != hypervisor.NotFound {
					return "", fmt.Errorf("domain %s left by an earlier attempt (%v) could not be removed (%v, %v)", out.VMName, st, st2, err)
				}
			}
			if disks, err = h.validateDisks(p.Bundles); err != nil {
				return "", err
			}
			detail := fmt.Sprintf("bridge %s; disks %s unmounted", h.cfg.Bridge, strings.Join(disks, ", "))
			if alreadyRunning {
				return detail, nil
			}
			// The domain is built (CPU sets checked against the host) before any disk is
			// written: a plan that would over-subscribe or float fails here.
			if domXML, placed, err = h.DomainXML(p, disks, filepath.Join(dir, "seed.iso"), filepath.Join(dir, "OVMF_VARS.fd")); err != nil {
				return "", fmt.Errorf("domain: %w", err)
			}
			return detail + "; domain built from the plan", nil
		}},
		{"dhcp_reservation", func() (string, error) {
			if err := h.cfg.DHCP.Reserve(dhcpd.Reservation{MAC: boot.MACAddress, IP: boot.PrivateIP, Hostname: hostname(p.AllocationID), AllocationID: p.AllocationID}); err != nil {
				return "", planInvalid("%v", err)
			}
			cleanup = append(cleanup, func() { _ = h.cfg.DHCP.Release(boot.MACAddress) })
			return boot.MACAddress + " -> " + boot.PrivateIP, nil
		}},
		{"image_write_convert", func() (string, error) {
			if alreadyRunning {
				return "", Skip("domain already running (retried task): its boot disk is in use")
			}
			format := p.Image.Format
			if format == "" {
				format = "qcow2"
			}
			if _, err := h.cfg.Run.Run(ctx, "qemu-img", "convert", "-q", "-f", format, "-O", "raw", "-n", imagePath, disks[0]); err != nil {
				return "", fmt.Errorf("qemu-img convert onto %s: %w", disks[0], err)
			}
			return fmt.Sprintf("%s -> %s (raw)", p.Image.Slug, disks[0]), nil
		}},
		{"domain_define_start", func() (string, error) {
			if alreadyRunning {
				return "", Skip("domain already running (retried task)")
			}
			if err := copyFile(h.cfg.VarsTemplate, filepath.Join(dir, "OVMF_VARS.fd"), 0o600); err != nil {
				return "", fmt.Errorf("UEFI variable store: %w", err)
			}
			if err := h.cfg.Hypervisor.Define(string(domXML)); err != nil {
				return "", err
			}
			cleanup = append(cleanup, func() { h.destroyAndUndefine(out.VMName) })
			started = time.Now()
			if err := h.cfg.Hypervisor.Start(out.VMName); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s defined and started (%d disks); %s", out.VMName, len(disks), placed), nil
		}},
		{"readiness", func() (string, error) {
			return h.readiness(ctx, p, signer, started, dir)
		}},
		{"performance_probe", func() (string, error) {
			return h.probe(ctx, p, signer, dir), nil // best effort: never fails the task
		}},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if err := rec.RunDetail(s.name, s.fn); err != nil {
			return out, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	succeeded = true
	return out, nil
}

func downloadDetail(done, total int64) string {
	const mib = 1 << 20
	if total > 0 {
		return fmt.Sprintf("%d of %d MiB (%d%%)", done/mib, total/mib, done*100/total)
	}
	return fmt.Sprintf("%d MiB", done/mib)
}

func slotIDs(bs []task.Bundle) []string {
	var ids []string
	for _, b := range bs {
		ids = append(ids, b.SlotID)
	}
	return ids
}

// hostname is the guest hostname of an allocation: gpuaas-<first 8 chars of its id>.
func hostname(allocationID string) string {
	id := strings.ToLower(strings.ReplaceAll(allocationID, "-", ""))
	if len(id) > 8 {
		id = id[:8]
	}
	return "gpuaas-" + id
}

// checkDependencies reports what is missing; production hosts are prepared by the host
// bootstrap, never by a provisioning task.
func (h *Host) checkDependencies() (string, error) {
	var missing []string
	for _, tool := range []string{"qemu-img"} {
		if _, err := h.cfg.Run.Run(context.Background(), tool, "--version"); err != nil {
			missing = append(missing, tool+" (apt-get install qemu-utils)")
		}
	}
	for _, f := range []string{h.cfg.LoaderPath, h.cfg.VarsTemplate} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f+" (apt-get install ovmf)")
		}
	}
	if _, err := h.cfg.Hypervisor.List("gpuaas-"); err != nil {
		missing = append(missing, "libvirtd ("+err.Error()+")")
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("host dependencies missing: %s", strings.Join(missing, "; "))
	}
	return "qemu-img, OVMF, libvirtd present", nil
}

// vfioCheck checks every GPU and VF is on vfio-pci, rebinding through driver_override only
// when allowed.
func (h *Host) vfioCheck(bs []task.Bundle) (string, error) {
	var rebound []string
	for _, b := range bs {
		for _, addr := range []string{b.GPUPCI, b.FabricVFPCI} {
			dev := "/sys/bus/pci/devices/" + addr
			if !h.cfg.FS.Exists(dev) {
				return "", planInvalid("PCI device %s is gone", addr)
			}
			drv := h.cfg.FS.LinkBase(dev + "/driver")
			if drv == "vfio-pci" {
				continue
			}
			if !h.cfg.VFIOBind {
				return "", fmt.Errorf("%s is bound to %q, not vfio-pci (set GPUAAS_SLICE_RUNTIME_VFIO_BIND=1 to let hostd rebind it)", addr, drv)
			}
			if err := h.rebind(addr, drv); err != nil {
				return "", err
			}
			rebound = append(rebound, addr)
		}
	}
	if len(rebound) > 0 {
		return "rebound to vfio-pci: " + strings.Join(rebound, ", "), nil
	}
	return fmt.Sprintf("%d devices on vfio-pci", 2*len(bs)), nil
}

func (h *Host) rebind(addr, current string) error {
	write := func(p, v string) error {
		full, err := h.cfg.FS.Path(p)
		if err != nil {
			return err
		}
		return os.WriteFile(full, []byte(v), 0o200)
	}
	if err := write("/sys/bus/pci/devices/"+addr+"/driver_override", "vfio-pci"); err != nil {
		return fmt.Errorf("driver_override %s: %w", addr, err)
	}
	if current != "" {
		if err := write("/sys/bus/pci/devices/"+addr+"/driver/unbind", addr); err != nil {
			return fmt.Errorf("unbind %s from %s: %w", addr, current, err)
		}
	}
	if err := write("/sys/bus/pci/drivers_probe", addr); err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	if got := h.cfg.FS.LinkBase("/sys/bus/pci/devices/" + addr + "/driver"); got != "vfio-pci" {
		return fmt.Errorf("%s is on %q after rebinding, not vfio-pci", addr, got)
	}
	return nil
}

// validateDisks resolves each slot disk and refuses one that is not a block device or is
// mounted (the OS disk always is).
func (h *Host) validateDisks(bs []task.Bundle) ([]string, error) {
	w := disk.Wiper{FS: h.cfg.FS, Run: h.cfg.Run}
	var out []string
	for _, b := range bs {
		dev, err := w.Resolve(b.NVMeDevice)
		if err != nil {
			return nil, planInvalid("slot %d disk %s: %v", b.SlotIndex, b.NVMeDevice, err)
		}
		out = append(out, dev)
	}
	return out, nil
}

// active is true unless the domain is known to be shut off or absent (an error counts as
// active: never wipe under a domain that may run).
func (h *Host) active(name string) bool {
	st, err := h.cfg.Hypervisor.State(name)
	return err != nil || st.Active()
}

func (h *Host) destroyAndUndefine(name string) {
	_ = h.cfg.Hypervisor.Destroy(name) // idempotent: an inactive domain is left alone
	_ = h.cfg.Hypervisor.Undefine(name)
}

// DomainXML builds the domain of a plan: production (KVM, passthrough, per-slot pinning,
// strict memory binding, guest NUMA cells) or lab (emulated, no passthrough, Linux bridge,
// binding and pinning only to what the lab host has). The summary says where vCPUs, threads
// and memory went.
func (h *Host) DomainXML(p *task.VMProvision, disks []string, seedISO, nvram string) ([]byte, string, error) {
	return BuildDomain(DomainInput{Plan: p, Disks: disks, SeedISO: seedISO, NVRAM: nvram, Lab: h.cfg.Lab, ConsoleLog: filepath.Join(filepath.Dir(seedISO), "console.log"),
		Bridge: h.cfg.Bridge, OVS: h.cfg.OVS, Loader: h.cfg.LoaderPath, FS: h.cfg.FS})
}

// DomainInput is everything BuildDomain needs.
type DomainInput struct {
	Plan    *task.VMProvision
	Disks   []string // resolved slot disks, boot first (defaults to the plan's NVMe paths)
	SeedISO string
	NVRAM   string
	// ConsoleLog keeps a copy of the serial console (optional).
	ConsoleLog string
	Lab        bool
	Bridge     string
	OVS        bool
	Loader     string
	FS         hostfs.FS // the host's NUMA nodes and their CPUs (/sys/devices/system/node)
}

// BuildDomain turns a plan into domain XML: memory and vCPUs summed across slots (the
// profile's, split evenly, when the slots carry none), each slot's vCPUs pinned to its own
// host CPUs, emulator and I/O threads to the housekeeping CPUs, memory bound strictly per
// guest NUMA cell, hugepages when the profile asks. It returns the placement summary too.
func BuildDomain(in DomainInput) ([]byte, string, error) {
	p := in.Plan
	if err := validatePlan(p.Bundles); err != nil {
		return nil, "", err
	}
	pl, err := place(p, in.FS, in.Lab)
	if err != nil {
		return nil, "", err
	}
	vcpus, mem := 0, 0
	for i, b := range p.Bundles {
		vcpus += pl.bundles[i].VCPUs
		mem += b.MemoryMiB
	}
	if mem == 0 {
		mem = p.Profile.MemoryMiB
	}
	spec := domainxml.Spec{Name: VMName(p.AllocationID), VCPUs: vcpus, MemoryMiB: mem, SeedISO: in.SeedISO,
		MAC: p.Bundles[0].MACAddress, Bridge: in.Bridge, OVS: in.OVS && !in.Lab, Emulated: in.Lab, LabOffloadOff: in.Lab,
		LoaderPath: in.Loader, NVRAMPath: in.NVRAM, ConsoleLog: in.ConsoleLog, Hugepages: wantsHugepages(p.Profile.Hugepages) && !in.Lab,
		HousekeepingCPUs: pl.hk}
	for i, b := range p.Bundles {
		db := pl.bundles[i]
		db.GPUPCI, db.FabricVFPCI, db.Disk = b.GPUPCI, b.FabricVFPCI, b.NVMeDevice
		db.Serial = fmt.Sprintf("gpuaas-slot%d", b.SlotIndex) // the guest tells its slots' disks apart
		if i < len(in.Disks) {
			db.Disk = in.Disks[i]
		}
		spec.Bundles = append(spec.Bundles, db)
	}
	x, err := domainxml.Build(spec)
	return x, pl.summary, err
}

func wantsHugepages(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "false" && s != "{}" && !strings.Contains(s, `"enabled":false`) && !strings.Contains(s, `"enabled": false`)
}

// readiness is seed 001's gate: DHCP lease seen -> TCP 22 -> SSH with the relay key (the
// guest's host key pinned to the slice dir) -> ready marker (and cloud-init done when the
// guest has cloud-init) -> nvidia-smi -L when the profile has GPUs and they are passed through.
func (h *Host) readiness(ctx context.Context, p *task.VMProvision, signer ssh.Signer, since time.Time, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.ReadinessTimeout)
	defer cancel()
	boot := p.Bundles[0]
	t0 := time.Now()
	var stages []string
	mark := func(s string) { stages = append(stages, fmt.Sprintf("%s %.1fs", s, time.Since(t0).Seconds())) }
	fail := func(stage string, err error) (string, error) {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %s (%v)", context.DeadlineExceeded, h.cfg.ReadinessTimeout, err)
		}
		return strings.Join(stages, ", "), &ReadinessError{Stage: stage, Err: err, Console: tailFile(filepath.Join(dir, "console.log"), 12)}
	}
	if err := poll(ctx, func() error {
		if seen := h.cfg.DHCP.LeaseSeen(boot.MACAddress); seen.IsZero() || seen.Before(since.Add(-time.Second)) {
			return fmt.Errorf("no DHCP lease for %s yet", boot.MACAddress)
		}
		return nil
	}); err != nil {
		return fail("dhcp_lease", err)
	}
	mark("dhcp")
	addr := net.JoinHostPort(boot.PrivateIP, strconv.Itoa(h.cfg.GuestSSHPort))
	if err := poll(ctx, func() error {
		c, err := (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		return fail("tcp_22", err)
	}
	mark("tcp22")
	var cl *ssh.Client
	if err := poll(ctx, func() error {
		var err error
		cl, err = dialGuest(ctx, addr, p.Image.Username, signer, filepath.Join(dir, "guest_host_key"))
		return err
	}); err != nil {
		return fail("ssh", err)
	}
	defer cl.Close()
	mark("ssh")
	check := "if command -v cloud-init >/dev/null 2>&1; then cloud-init status --wait >/dev/null || exit 3; fi; test -f " + ReadyMarker
	if err := poll(ctx, func() error { _, err := runSSH(cl, check); return err }); err != nil {
		return fail("ready_marker", err)
	}
	mark("ready")
	if p.Profile.GPUCount > 0 {
		if h.cfg.Lab {
			stages = append(stages, "nvidia-smi skipped: lab host")
		} else {
			outb, err := runSSH(cl, "nvidia-smi -L")
			if err != nil {
				return fail("nvidia_smi", fmt.Errorf("%v: %s", err, outb))
			}
			if n := strings.Count(string(outb), "GPU "); n < p.Profile.GPUCount {
				return fail("nvidia_smi", fmt.Errorf("guest sees %d GPUs, the profile has %d", n, p.Profile.GPUCount))
			}
			mark("nvidia-smi")
		}
	}
	return strings.Join(stages, ", "), nil
}

// poll retries fn every 500 ms until it succeeds or ctx ends (returning fn's last error).
func poll(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// dialGuest opens SSH to the guest as user with the relay key. The guest's host key is
// pinned to pinFile on first contact (readiness) and checked on every later connection.
func dialGuest(ctx context.Context, addr, user string, signer ssh.Signer, pinFile string) (*ssh.Client, error) {
	cb := func(_ string, _ net.Addr, key ssh.PublicKey) error {
		line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
		pinned, err := os.ReadFile(pinFile)
		if errors.Is(err, os.ErrNotExist) {
			return os.WriteFile(pinFile, []byte(line+"\n"), 0o600)
		}
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(pinned)) != line {
			return fmt.Errorf("guest host key changed (pinned %s)", pinFile)
		}
		return nil
	}
	// ed25519 first: small guests (dropbear) often carry only an ed25519 host key and some
	// builds mis-negotiate when RSA is preferred.
	cfg := &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: cb, Timeout: 10 * time.Second,
		HostKeyAlgorithms: []string{ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256}}
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

func runSSH(cl *ssh.Client, cmd string) ([]byte, error) {
	s, err := cl.NewSession()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	if len(out) > 4096 {
		out = out[:4096]
	}
	return out, err
}

// probe is the best-effort performance snapshot of the guest (nvidia-smi when present).
func (h *Host) probe(ctx context.Context, p *task.VMProvision, signer ssh.Signer, dir string) string {
	addr := net.JoinHostPort(p.Bundles[0].PrivateIP, strconv.Itoa(h.cfg.GuestSSHPort))
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cl, err := dialGuest(cctx, addr, p.Image.Username, signer, filepath.Join(dir, "guest_host_key"))
	if err != nil {
		return "best effort, not measured: " + err.Error()
	}
	defer cl.Close()
	out, err := runSSH(cl, "echo cpus=$(grep -c ^processor /proc/cpuinfo) mem_kb=$(sed -n 's/^MemTotal: *\\([0-9]*\\).*/\\1/p' /proc/meminfo); command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,temperature.gpu --format=csv,noheader || true")
	if err != nil {
		return "best effort, not measured: " + err.Error()
	}
	return strings.Join(strings.Fields(string(out)), " ")
}

// EnsureTerminalKey loads or creates the host relay key (ed25519, 0600; .pub 0644) and
// returns its signer and authorized_keys line.
func EnsureTerminalKey(path string) (ssh.Signer, string, error) {
	if b, err := os.ReadFile(path); err == nil {
		s, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, "", fmt.Errorf("terminal key %s: %w", path, err)
		}
		return s, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " gpuaas-terminal", nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, "", err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "gpuaas-terminal")
	if err != nil {
		return nil, "", err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(blk), 0o600); err != nil {
		return nil, "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, "", err
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, "", err
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " gpuaas-terminal"
	return s, pub, os.WriteFile(path+".pub", []byte(pub+"\n"), 0o644)
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	hsh := sha256.New()
	if _, err := io.Copy(hsh, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(hsh.Sum(nil)), nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// Release tears a slice down (seed 000 "Release"): graceful shutdown, hard destroy after the
// graceful timeout, undefine with NVRAM, devices left on vfio-pci, seed dir and DHCP
// reservation removed, each disk wiped and verified when asked, leases released only for
// slots whose disks are clean, telemetry token revoked. Idempotent: a VM already gone is fine.
func (h *Host) Release(ctx context.Context, p *task.VMRelease, rec *Recorder) (task.ReleaseOutput, error) {
	name := VMName(p.AllocationID)
	out := task.ReleaseOutput{Runtime: h.Name(), VMName: name, Wiped: map[string]task.WipeProof{}, SlotCount: len(p.Bundles)}
	defer h.working(p.AllocationID)()
	if len(p.Bundles) == 0 {
		return out, errors.New("release plan has no bundles")
	}
	graceful := time.Duration(p.GracefulTimeoutS) * time.Second
	if graceful <= 0 {
		graceful = 120 * time.Second
	}
	cleanSlots := map[string]bool{}
	var wipeErr error
	steps := []struct {
		name string
		fn   func() (string, error)
	}{
		{"shutdown", func() (string, error) {
			st, err := h.cfg.Hypervisor.State(name)
			if err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
				return "", err
			}
			if !st.Active() {
				return "domain not running (" + string(st) + ")", nil
			}
			// Only a running guest can power off on request; a paused (or otherwise stuck)
			// one is destroyed at once. Either way the domain must be gone from the disks
			// before they are wiped: "in shutdown" is not off.
			why := "domain " + string(st) + ": destroyed"
			if st == hypervisor.Running {
				if err := h.cfg.Hypervisor.Shutdown(name); err != nil {
					h.cfg.Log.Warn("graceful shutdown request failed; destroying", "vm", name, "err", err)
				}
				sctx, cancel := context.WithTimeout(ctx, graceful)
				defer cancel()
				t0 := time.Now()
				if err := poll(sctx, func() error {
					if h.active(name) {
						return errors.New("still running")
					}
					return nil
				}); err == nil {
					return fmt.Sprintf("guest powered off in %.1fs", time.Since(t0).Seconds()), nil
				}
				why = fmt.Sprintf("still running after %s: destroyed", graceful)
			}
			if err := h.cfg.Hypervisor.Destroy(name); err != nil {
				return "", err
			}
			if st, err := h.cfg.Hypervisor.State(name); err != nil || st.Active() {
				return "", fmt.Errorf("domain %s still %s after destroy (%v)", name, st, err)
			}
			out.HardStopped = true
			return why, nil
		}},
		{"undefine", func() (string, error) {
			err := h.cfg.Hypervisor.Undefine(name)
			if errors.Is(err, hypervisor.ErrNotFound) {
				return "no domain defined", nil
			}
			return "undefined with NVRAM", err
		}},
		{"vfio_rebind", func() (string, error) {
			if h.cfg.Lab {
				return "", Skip(labSkip)
			}
			var bad []string
			for _, b := range p.Bundles {
				for _, a := range []string{b.GPUPCI, b.FabricVFPCI} {
					if d := h.cfg.FS.LinkBase("/sys/bus/pci/devices/" + a + "/driver"); d != "vfio-pci" {
						bad = append(bad, a+"="+d)
					}
				}
			}
			if len(bad) > 0 {
				return "", fmt.Errorf("devices not on vfio-pci after release: %s", strings.Join(bad, ", "))
			}
			return "GPUs and VFs stay on vfio-pci", nil
		}},
		{"cloud_init_cleanup", func() (string, error) {
			return h.SliceDir(p.AllocationID) + " removed", os.RemoveAll(h.SliceDir(p.AllocationID))
		}},
		{"dhcp_release", func() (string, error) {
			var macs []string
			for _, b := range p.Bundles {
				if b.MACAddress == "" {
					continue
				}
				if err := h.cfg.DHCP.Release(b.MACAddress); err != nil {
					return "", err
				}
				macs = append(macs, b.MACAddress)
			}
			return "released " + strings.Join(macs, ", "), nil
		}},
		{"wipe_verify", func() (string, error) {
			if !p.Wipe {
				for _, b := range p.Bundles {
					cleanSlots[b.SlotID] = true
				}
				return "", Skip("wipe not requested")
			}
			w := disk.Wiper{FS: h.cfg.FS, Run: h.cfg.Run}
			held, err := h.cfg.Leases.Held()
			if err != nil {
				return "", err
			}
			var done []string
			for _, b := range p.Bundles {
				if owner := leasedToOther(held, b, p.AllocationID); owner != "" {
					// The host says another allocation owns this disk: never wipe it.
					out.Wiped[b.SlotID] = task.WipeProof{Error: "refused: " + b.NVMeDevice + " is leased to allocation " + owner}
					wipeErr = errors.Join(wipeErr, fmt.Errorf("slot %d %s: leased to allocation %s", b.SlotIndex, b.NVMeDevice, owner))
					continue
				}
				ev, err := w.WipeWith(ctx, disk.WipeOptions{Device: b.NVMeDevice, Apply: true, Policy: b.WipePolicy, Identity: b.DiskIdentity})
				proof := task.WipeProof{Verified: err == nil && ev.Verified, Method: ev.Method,
					Evidence: fmt.Sprintf("%s (%s, %s): %d bytes, %d sampled, %d non-zero regions, signature after %q", b.NVMeDevice, ev.Resolved, ev.Identity, ev.Bytes, ev.SampledBytes, ev.NonZeroRegions, ev.SignatureAfter)}
				proof.Details, _ = json.Marshal(ev)
				if err != nil {
					proof.Error = err.Error()
				} else if !ev.Verified {
					proof.Error = "not verified: " + ev.Error
				}
				out.Wiped[b.SlotID] = proof
				if proof.Verified {
					cleanSlots[b.SlotID] = true
					done = append(done, b.NVMeDevice)
				} else {
					wipeErr = errors.Join(wipeErr, fmt.Errorf("slot %d %s: %s", b.SlotIndex, b.NVMeDevice, proof.Error))
				}
			}
			if wipeErr != nil {
				return "", wipeErr
			}
			return "wiped and verified: " + strings.Join(done, ", "), nil
		}},
		{"lease_release", func() (string, error) {
			var slots []string
			for _, b := range p.Bundles {
				if cleanSlots[b.SlotID] {
					slots = append(slots, b.SlotID)
				}
			}
			terr := h.cfg.Telemetry.Unregister(p.AllocationID)
			n, err := h.cfg.Leases.Release(p.AllocationID, slots)
			err = errors.Join(err, terr)
			out.LeasesReleased = n
			if len(slots) < len(p.Bundles) {
				return fmt.Sprintf("%d released; slots with unverified disks keep their lease", n), err
			}
			return fmt.Sprintf("%d released", n), err
		}},
	}
	var firstErr error
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		// wipe_verify failing must not stop the lease/telemetry cleanup of clean slots.
		if err := rec.RunDetail(s.name, s.fn); err != nil {
			if s.name != "wipe_verify" {
				return out, fmt.Errorf("%s: %w", s.name, err)
			}
			firstErr = fmt.Errorf("%s: %w", s.name, err)
		}
	}
	out.Released = firstErr == nil
	return out, firstErr
}

var ansiRE = regexp.MustCompile(`\x1b(\[[0-9;=?]*[A-Za-z]|[()][A-Za-z0-9])`)

// leasedToOther is the allocation other than alloc holding a lease on the bundle's slot or
// any of its devices ("" if none).
func leasedToOther(held []leases.Lease, b task.Bundle, alloc string) string {
	for _, l := range held {
		if l.AllocationID == alloc {
			continue
		}
		if l.SlotID == b.SlotID {
			return l.AllocationID
		}
		for _, d := range l.Devices {
			if d != "" && (d == b.NVMeDevice || d == b.GPUPCI || d == b.FabricVFPCI) {
				return l.AllocationID
			}
		}
	}
	return ""
}

// tailFile is the last n non-empty lines of a console log, terminal escapes removed, each
// line cut to 200 bytes, joined with " | " ("" if unreadable).
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	b = ansiRE.ReplaceAll(b, nil)
	var lines []string
	for _, l := range strings.FieldsFunc(string(b), func(r rune) bool { return r == '\n' || r == '\r' }) {
		l = strings.TrimSpace(strings.Map(func(r rune) rune {
			if r < 0x20 || r == 0x7f {
				return -1
			}
			return r
		}, l))
		if len(l) > 200 {
			l = l[:200] + "…"
		}
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
