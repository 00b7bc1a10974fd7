// Package agent is gpuaas-hostd: enrollment, the long-poll loop for signed tasks, the
// executor registry, a durable result spool, heartbeats and live progress. It dials out
// only; the controller never connects to a host.
package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/topology"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// Config is hostd's typed configuration: flags > GPUAAS_* env > file.
type Config struct {
	Server         string   `mapstructure:"server" yaml:"server"`
	Servers        []string `mapstructure:"servers" yaml:"servers,omitempty"` // more controllers to fail over to (ServerList)
	NodeID         string   `mapstructure:"node_id" yaml:"node_id"`
	CAFile         string   `mapstructure:"ca_file" yaml:"ca_file"`
	CertFile       string   `mapstructure:"cert_file" yaml:"cert_file"`
	KeyFile        string   `mapstructure:"key_file" yaml:"key_file"`
	SigningPubFile string   `mapstructure:"signing_pub_file" yaml:"signing_pub_file"`
	StateDir       string   `mapstructure:"state_dir" yaml:"state_dir"`
	HostRoot       string   `mapstructure:"host_root" yaml:"host_root"`
	Runtime        string   `mapstructure:"runtime" yaml:"runtime"`
	// LabHost is set by `enroll --lab-host` only: this host is the lab host VM (internal/
	// labhost), its discovery counts emulated stand-ins as GPUs and fabric, its slice VMs run
	// under software emulation (never nested KVM), and the controller records it as simulated.
	LabHost       bool          `mapstructure:"lab_host" yaml:"lab_host,omitempty"`
	MaxConcurrent int           `mapstructure:"max_concurrent" yaml:"max_concurrent"`
	PollWait      time.Duration `mapstructure:"poll_wait" yaml:"poll_wait"`
	Heartbeat     time.Duration `mapstructure:"heartbeat" yaml:"heartbeat"`
	// HealthInterval is how often hostd reads its devices' health (PCIe, kernel Xid lines,
	// nvidia-smi) and reports what changed (internal/health); negative: never.
	HealthInterval time.Duration `mapstructure:"health_interval" yaml:"health_interval,omitempty"`
	ClockSkew      time.Duration `mapstructure:"clock_skew" yaml:"clock_skew"`
	MetricsListen  string        `mapstructure:"metrics_listen" yaml:"metrics_listen"`
	// SimPhaseDelay makes each simulated phase take this long (sim runtime only), so
	// operators and tests can watch progress and interrupt a running task.
	SimPhaseDelay time.Duration `mapstructure:"sim_phase_delay" yaml:"sim_phase_delay,omitempty"`
	// SimHoldPhase names a provision or release phase that, once started, never finishes on
	// its own (sim runtime only): crash tests kill the daemon there without racing a clock.
	SimHoldPhase string `mapstructure:"sim_hold_phase" yaml:"sim_hold_phase,omitempty"`

	// The VM runtimes (lab, libvirt).
	DataDir          string        `mapstructure:"data_dir" yaml:"data_dir,omitempty"`             // /var/lib/gpuaas
	Bridge           string        `mapstructure:"bridge" yaml:"bridge,omitempty"`                 // ovsbr0 (libvirt), gpuaasbr0 (lab)
	BridgeAddress    string        `mapstructure:"bridge_address" yaml:"bridge_address,omitempty"` // 10.100.0.1/24: DHCP server and router
	LibvirtSocket    string        `mapstructure:"libvirt_socket" yaml:"libvirt_socket,omitempty"`
	OVMFCode         string        `mapstructure:"ovmf_code" yaml:"ovmf_code,omitempty"`
	OVMFVars         string        `mapstructure:"ovmf_vars" yaml:"ovmf_vars,omitempty"`
	TelemetryAddr    string        `mapstructure:"telemetry_addr" yaml:"telemetry_addr,omitempty"` // GPUAAS_TELEMETRY_ADDR, :9110
	ReadinessTimeout time.Duration `mapstructure:"readiness_timeout" yaml:"readiness_timeout,omitempty"`
	// SliceRuntimeVFIOBind is GPUAAS_SLICE_RUNTIME_VFIO_BIND: allow rebinding to vfio-pci.
	SliceRuntimeVFIOBind bool `mapstructure:"slice_runtime_vfio_bind" yaml:"slice_runtime_vfio_bind,omitempty"`
	// SliceTerminalSSHKeyPath is GPUAAS_SLICE_TERMINAL_SSH_KEY_PATH (host relay key).
	SliceTerminalSSHKeyPath string `mapstructure:"slice_terminal_ssh_key_path" yaml:"slice_terminal_ssh_key_path,omitempty"`
	// NodeSchedulerLeaseTTLSeconds is GPUAAS_NODE_SCHEDULER_LEASE_TTL_SECONDS, clamped to [300, 604800].
	NodeSchedulerLeaseTTLSeconds int `mapstructure:"node_scheduler_lease_ttl_seconds" yaml:"node_scheduler_lease_ttl_seconds,omitempty"`
	// ImageCacheBudgetGiB bounds the slice image cache (slice-images/); 0 leaves it unbounded.
	// Least recently used images go first; an image a slice here uses never does.
	ImageCacheBudgetGiB int `mapstructure:"image_cache_budget_gib" yaml:"image_cache_budget_gib,omitempty"`
}

// BindRunFlags declares `run` flags.
func BindRunFlags(fs *pflag.FlagSet) {
	fs.String("config", "/etc/gpuaas/hostd.yaml", "config file written by enroll")
	fs.StringSlice("server", nil, "controller URL(s), repeatable or comma-separated; replaces server/servers from the config file")
	fs.String("host-root", "", "root of the host seam (sysfs, /dev, /var/lib/gpuaas); default /")
	fs.String("runtime", "", "slice runtime: sim, lab or libvirt")
	fs.String("state-dir", "", "hostd state (spool, completed tasks); default /var/lib/gpuaas/hostd")
	fs.Int("max-concurrent", 0, "tasks run at once (default 4)")
	fs.Duration("poll-wait", 0, "long-poll wait (default 30s)")
	fs.Duration("heartbeat", 0, "heartbeat interval (default 15s)")
	fs.Duration("health-interval", 0, "device health scan interval (default 60s; negative: off)")
	fs.String("metrics-listen", "", "serve Prometheus /metrics here, e.g. 127.0.0.1:9464 (default off)")
	fs.Duration("sim-phase-delay", 0, "sim runtime only: time each simulated phase takes")
	fs.String("sim-hold-phase", "", "sim runtime only: a provision or release phase that never finishes once started (crash tests)")
	fs.String("data-dir", "", "lab/libvirt: slice data (slices/, slice-images/, node-scheduler/leases/, terminal/); default /var/lib/gpuaas under the host root")
	fs.String("bridge", "", "lab/libvirt: slice bridge (default ovsbr0; lab: gpuaasbr0)")
	fs.String("bridge-address", "", "lab/libvirt: this host's address on the bridge, served by DHCP as router (default 10.100.0.1/24)")
	fs.String("libvirt-socket", "", "lab/libvirt: libvirtd socket (default /run/libvirt/libvirt-sock)")
	fs.String("ovmf-code", "", "lab/libvirt: UEFI firmware (default /usr/share/OVMF/OVMF_CODE_4M.fd)")
	fs.String("ovmf-vars", "", "lab/libvirt: UEFI variable-store template (default /usr/share/OVMF/OVMF_VARS_4M.fd)")
	fs.String("telemetry-addr", "", "lab/libvirt: guest telemetry listener (default :9110; \"off\" disables)")
	fs.Duration("readiness-timeout", 0, "lab/libvirt: VM readiness gate timeout (default 120s)")
	fs.Bool("slice-runtime-vfio-bind", false, "libvirt: rebind GPUs/VFs to vfio-pci through driver_override when needed")
	fs.String("slice-terminal-ssh-key-path", "", "lab/libvirt: host relay key (default <data-dir>/terminal/id_ed25519)")
	fs.Int("node-scheduler-lease-ttl-seconds", 0, "slot lease TTL, clamped to [300, 604800] (default 86400)")
	fs.Int("image-cache-budget-gib", 0, "lab/libvirt: slice image cache budget in GiB; least recently used images not in use are evicted past it (default 0: unbounded)")
}

// LoadConfig reads the file named by --config, then env, then flags.
func LoadConfig(fs *pflag.FlagSet) (Config, error) {
	v := viper.New()
	path, _ := fs.GetString("config")
	if path == "" {
		return Config{}, fmt.Errorf("--config is required")
	}
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w (run `gpuaas-hostd enroll` first)", path, err)
	}
	var bindErr error
	fs.VisitAll(func(f *pflag.Flag) {
		key := strings.ReplaceAll(f.Name, "-", "_")
		if key == "config" {
			return
		}
		if err := v.BindEnv(key, "GPUAAS_"+strings.ToUpper(key)); err != nil {
			bindErr = err
		}
		if f.Changed && key == "server" {
			// --server is a list: it replaces the file's server and servers.
			list, _ := fs.GetStringSlice("server")
			v.Set("server", "")
			v.Set("servers", list)
		} else if f.Changed {
			v.Set(key, f.Value.String())
		}
	})
	if bindErr != nil {
		return Config{}, bindErr
	}
	var c Config
	if err := v.Unmarshal(&c); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	c.defaults()
	return c, c.Validate()
}

func (c *Config) defaults() {
	if c.HostRoot == "" {
		c.HostRoot = "/"
	}
	if c.StateDir == "" {
		c.StateDir = filepath.Join(c.HostRoot, "var/lib/gpuaas/hostd")
	}
	if c.Runtime == "" {
		c.Runtime = "libvirt"
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 4
	}
	if c.DataDir == "" {
		c.DataDir = filepath.Join(c.HostRoot, "var/lib/gpuaas")
	}
	if c.Bridge == "" {
		c.Bridge = map[bool]string{true: "gpuaasbr0", false: "ovsbr0"}[c.Runtime == "lab"]
	}
	if c.BridgeAddress == "" {
		c.BridgeAddress = "10.100.0.1/24"
	}
	if c.LibvirtSocket == "" {
		c.LibvirtSocket = "/run/libvirt/libvirt-sock"
	}
	if c.OVMFCode == "" {
		c.OVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	}
	if c.OVMFVars == "" {
		c.OVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	}
	if c.TelemetryAddr == "" {
		c.TelemetryAddr = ":9110"
	}
	if c.ReadinessTimeout == 0 {
		c.ReadinessTimeout = 120 * time.Second
	}
	if c.PollWait == 0 {
		c.PollWait = 30 * time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 15 * time.Second
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = time.Minute
	}
	if c.ClockSkew == 0 {
		c.ClockSkew = 2 * time.Minute
	}
}

// Validate checks the configuration before anything runs.
func (c Config) Validate() error {
	list := c.ServerList()
	if len(list) == 0 {
		return fmt.Errorf("server is empty: enroll first, or set server (or a servers list) to https://host:port")
	}
	for _, s := range list {
		if err := validServer(s); err != nil {
			return err
		}
	}
	if c.NodeID == "" {
		return fmt.Errorf("node_id is empty: enroll first")
	}
	for name, f := range map[string]string{"ca_file": c.CAFile, "cert_file": c.CertFile, "key_file": c.KeyFile, "signing_pub_file": c.SigningPubFile} {
		if f == "" {
			return fmt.Errorf("%s is empty: enroll first", name)
		}
	}
	if c.SimHoldPhase != "" && (c.Runtime != "sim" ||
		!slices.Contains(task.ProvisionPhases, c.SimHoldPhase) && !slices.Contains(task.ReleasePhases, c.SimHoldPhase)) {
		return fmt.Errorf("sim_hold_phase %q must name a slice.vm_provision or slice.vm_release phase, and needs runtime sim", c.SimHoldPhase)
	}
	if c.LabHost && c.Runtime != "libvirt" {
		return fmt.Errorf("lab_host is the libvirt runtime on the lab host VM, not runtime %q", c.Runtime)
	}
	switch c.Runtime {
	case "sim":
	case "lab", "libvirt":
		if _, _, err := net.ParseCIDR(c.BridgeAddress); err != nil {
			return fmt.Errorf("bridge_address %q must be an address with prefix, e.g. 10.100.0.1/24", c.BridgeAddress)
		}
		for name, p := range map[string]string{"data_dir": c.DataDir, "libvirt_socket": c.LibvirtSocket, "ovmf_code": c.OVMFCode, "ovmf_vars": c.OVMFVars} {
			if !filepath.IsAbs(p) {
				return fmt.Errorf("%s %q must be an absolute path", name, p)
			}
		}
		if c.ReadinessTimeout < 5*time.Second || c.ReadinessTimeout > time.Hour {
			return fmt.Errorf("readiness_timeout must be 5s..1h")
		}
		if c.NodeSchedulerLeaseTTLSeconds < 0 {
			return fmt.Errorf("node_scheduler_lease_ttl_seconds must not be negative")
		}
	default:
		return fmt.Errorf("runtime must be sim, lab or libvirt, not %q", c.Runtime)
	}
	if c.MaxConcurrent < 1 || c.MaxConcurrent > 64 {
		return fmt.Errorf("max_concurrent must be 1..64")
	}
	if c.PollWait < time.Second || c.PollWait > 60*time.Second {
		return fmt.Errorf("poll_wait must be 1s..60s")
	}
	return nil
}

// WriteConfig writes the config file (0600).
func WriteConfig(path string, c Config) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return writeAtomic(path, b, 0o600)
}

// DiscoverOptions are the discovery options this configuration implies.
func (c Config) DiscoverOptions() topology.Options {
	return topology.Options{LabStandIns: c.LabHost, VFIORebind: c.SliceRuntimeVFIOBind}
}
