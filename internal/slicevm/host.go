package slicevm

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/dhcpd"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/imagecache"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/telemetry"
)

// HostConfig is the Host runtime's view of the machine.
type HostConfig struct {
	// Lab runs the production code under software emulation (domain type qemu): loop devices
	// stand in for NVMe, a Linux bridge for OVS, and the phases that need PCI passthrough say
	// "skipped: lab host" (never "ok").
	Lab bool
	// SoftwareCPU runs the production runtime's domains (passthrough included) under
	// software emulation: the lab host VM, which has an IOMMU and devices but no KVM.
	SoftwareCPU bool
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
	// stages are the image stagings running on idle slots' disks (staging.go).
	stages staging
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
	h := &Host{cfg: cfg, turl: cfg.TelemetryURL, busy: map[string]int{}}
	if cfg.Images.Pinned == nil {
		// The cache's budget never evicts an image a slice here uses or is being written from.
		cfg.Images.Pinned = h.ImagesInUse
	}
	return h, nil
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

// SliceDir is the per-allocation directory (seed files, seed ISO, NVRAM, pinned guest host key).
func (h *Host) SliceDir(allocationID string) string {
	return filepath.Join(h.cfg.DataDir, "slices", allocationID)
}

const labSkip = "lab host: no PCI passthrough"

// softwareCPUSkip: on the lab host VM (no KVM) the guest boots under nested software
// emulation, far slower than any readiness timeout; the host is simulated, never sold.
const softwareCPUSkip = "simulated: lab host VM without KVM, the guest boots under nested software emulation and is not awaited"
