// Package controller wires the gpuaas-controller daemon: configuration, the embedded or
// external PostgreSQL, migrations, PKI bootstrap, the HTTPS API, and orderly shutdown.
// Only cmd/gpuaas-controller imports it.
package controller

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Config is the controller's typed configuration, loaded once: flags > GPUAAS_* env > file.
type Config struct {
	StateDir        string        `mapstructure:"state_dir"`
	Listen          string        `mapstructure:"listen"`
	DatabaseURL     string        `mapstructure:"database_url"`
	Hostnames       []string      `mapstructure:"hostname"`
	HeartbeatMaxAge time.Duration `mapstructure:"heartbeat_max_age"`
	LogLevel        string        `mapstructure:"log_level"`
	LogFormat       string        `mapstructure:"log_format"`
	MaxDBConns      int32         `mapstructure:"max_db_conns"`
	TaskLease       time.Duration `mapstructure:"task_lease"`
	ProvisionTTL    time.Duration `mapstructure:"provision_ttl"`
	// ReconcileInterval queues slice.reconcile on every reachable node this often (0: off).
	ReconcileInterval time.Duration `mapstructure:"reconcile_interval"`
	// Terminal relay (gpuaasctl ssh).
	TerminalRecordDir    string        `mapstructure:"terminal_record_dir"`
	TerminalIdle         time.Duration `mapstructure:"terminal_idle"`
	TerminalMaxPerTenant int           `mapstructure:"terminal_max_per_tenant"`
	// ReplicaWakeups publishes task wake-ups through PostgreSQL NOTIFY for other replicas.
	ReplicaWakeups bool `mapstructure:"replica_wakeups"`
	// PprofListen serves net/http/pprof on a loopback address for profiling (empty: off).
	PprofListen string `mapstructure:"pprof_listen"`
	// AdvertiseURL is this replica's address for the other replicas (terminal relay); empty:
	// https:// and the listen address (the machine's hostname when listening on all).
	AdvertiseURL string `mapstructure:"advertise_url"`
	// GCHeadroomMiB lets the Go heap grow this far past its live data before a collection
	// (never less than Go's own 2 x live; 0: Go's default; the GOGC variable overrides it).
	GCHeadroomMiB int `mapstructure:"gc_headroom_mib"`
	// MaxProcs is how many CPUs the Go runtime schedules on: auto (half when PostgreSQL runs
	// on this machine, else all), all, or a count; the GOMAXPROCS variable overrides it.
	MaxProcs string `mapstructure:"max_procs"`
	// AllowSimulatedHosts sells nodes whose hostd runs the sim runtime and accepts their
	// simulated provisioning and wipes (demo, soak, bench). Off, the database refuses them.
	AllowSimulatedHosts bool `mapstructure:"allow_simulated_hosts"`
	// AllowUntestedImages lets an image be registered or made active without a passed smoke
	// test of its digest (test fixtures). Off, the database refuses it (migration 027).
	AllowUntestedImages bool `mapstructure:"allow_untested_images"`
	// WebhookCAFile adds CA certificates (PEM) to the system roots that webhook receivers'
	// certificates may chain to; WebhookAllowPrivate lets webhooks reach internal addresses.
	WebhookCAFile       string `mapstructure:"webhook_ca_file"`
	WebhookAllowPrivate bool   `mapstructure:"webhook_allow_private"`
	// ImageKeys is the file of trusted image publisher keys ("NAME BASE64KEY" lines,
	// imagesig); empty: none, and no signed image can be registered.
	ImageKeys string `mapstructure:"image_keys"`
	// EventRetention is how long the event log keeps an event (0: forever); webhooks' owed
	// events are kept past it until delivered or dead.
	EventRetention time.Duration `mapstructure:"event_retention"`
}

// DefaultStateDir is where a packaged controller keeps its state.
const DefaultStateDir = "/var/lib/gpuaas-controller"

// bindFlags declares the flags a command uses; only declared names are bound.
func bindFlags(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		switch n {
		case "state-dir":
			fs.String(n, DefaultStateDir, "state directory: TLS material, admin token, embedded PostgreSQL")
		case "listen":
			fs.String(n, "127.0.0.1:8443", "HTTPS listen address (HOST:PORT; port 0 picks one, written to STATE_DIR/controller.addr)")
		case "database-url":
			fs.String(n, "", "PostgreSQL URL; empty runs a private cluster under STATE_DIR/postgres")
		case "hostname":
			fs.StringSlice(n, nil, "extra DNS names or IPs for the server certificate (repeatable)")
		case "heartbeat-max-age":
			fs.Duration(n, 2*time.Minute, "exclude nodes whose agent heartbeat is older than this from placement (0 disables)")
		case "log-level":
			fs.String(n, "info", "log level: debug, info, warn, error")
		case "log-format":
			fs.String(n, "text", "log format: text or json")
		case "max-db-conns":
			fs.Int32(n, 8, "database connection pool size for tenant and operator requests")
		case "task-lease":
			fs.Duration(n, 2*time.Minute, "visibility timeout of a leased host task; a silent host's task is redelivered after it")
		case "provision-ttl":
			fs.Duration(n, 20*time.Minute, "deadline of slice.vm_provision; past it the allocation fails")
		case "reconcile-interval":
			fs.Duration(n, 10*time.Minute, "queue slice.reconcile (drift check) on every reachable node this often (0 disables)")
		case "terminal-record-dir":
			fs.String(n, "", "record terminal-mode session output as asciicast v2 files here (0600; default: off)")
		case "terminal-idle":
			fs.Duration(n, 30*time.Minute, "end a terminal session after this long without traffic")
		case "terminal-max-per-tenant":
			fs.Int(n, 8, "concurrent terminal sessions per tenant")
		case "replica-wakeups":
			fs.Bool(n, true, "wake long polls held by other controller replicas through PostgreSQL NOTIFY (false: single replica)")
		case "pprof-listen":
			fs.String(n, "", "serve Go pprof profiles over HTTPS (the API's certificate) on this loopback HOST:PORT (debugging; empty: off)")
		case "advertise-url":
			fs.String(n, "", "this replica's own https://HOST:PORT for the other replicas, which relay terminal sessions it holds to it (default: the listen address; the hostname when listening on all addresses)")
		case "gc-headroom-mib":
			fs.Int(n, 48, "let the heap grow this many MiB past its live data before a garbage collection (at least Go's own 2x live): a small heap under load collects far less often; 0 = Go's default; a GOGC variable overrides it")
		case "max-procs":
			fs.String(n, "auto", "CPUs the Go runtime schedules on: auto (half of them when PostgreSQL runs on this machine, so the controller's idle processors do not spin on the database's cores; else all), all, or a count; a GOMAXPROCS variable overrides it")
		case "allow-simulated-hosts":
			fs.Bool(n, false, "place tenant allocations on hosts running the sim runtime and accept their simulated provisioning and wipe proofs (demo, soak, bench only: no VM exists and no disk is wiped there)")
		case "allow-untested-images":
			fs.Bool(n, false, "let images be registered or made active without a passed smoke test of their digest (test fixtures only: such an image was never booted through the provisioning path)")
		case "webhook-ca-file":
			fs.String(n, "", "PEM file of extra CA certificates webhook receivers' certificates may chain to, besides the system roots (certificates are always verified)")
		case "webhook-allow-private":
			fs.Bool(n, false, "let webhooks reach loopback, private and link-local addresses (refused by default at connect time: no requests into the controller's own network)")
		case "image-keys":
			fs.String(n, "", "file of trusted image publisher keys, one \"NAME BASE64-ED25519-PUBLIC-KEY\" per line: image signatures must verify against one; hosts get them in each provisioning task (docs/images.md)")
		case "event-retention":
			fs.Duration(n, 30*24*time.Hour, "keep events this long (at least 24h; 0 keeps them forever): older ones are removed with their finished webhook deliveries, never one a webhook still owes; a reader whose cursor they passed gets 410 cursor_expired")
		case "config":
			fs.String(n, "", "config file (YAML); keys as flag names with _ for -")
		}
	}
}

// loadConfig reads flags, GPUAAS_* environment and an optional file into Config.
func loadConfig(fs *pflag.FlagSet) (Config, error) {
	v := viper.New()
	v.SetEnvPrefix("GPUAAS")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	var bindErr error
	fs.VisitAll(func(f *pflag.Flag) {
		key := strings.ReplaceAll(f.Name, "-", "_")
		if err := v.BindPFlag(key, f); err != nil {
			bindErr = err
		}
		if err := v.BindEnv(key, "GPUAAS_"+strings.ToUpper(key)); err != nil {
			bindErr = err
		}
	})
	if bindErr != nil {
		return Config{}, bindErr
	}
	if f := v.GetString("config"); f != "" {
		v.SetConfigFile(f)
		if err := v.ReadInConfig(); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", f, err)
		}
	}
	var c Config
	if err := v.Unmarshal(&c); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return c, c.validate(fs)
}

func (c Config) validate(fs *pflag.FlagSet) error {
	if fs.Lookup("state-dir") != nil && c.StateDir == "" {
		return fmt.Errorf("--state-dir must not be empty")
	}
	if fs.Lookup("listen") != nil {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			return fmt.Errorf("--listen %q: want HOST:PORT: %w", c.Listen, err)
		}
	}
	if fs.Lookup("heartbeat-max-age") != nil && c.HeartbeatMaxAge < 0 {
		return fmt.Errorf("--heartbeat-max-age must not be negative")
	}
	if fs.Lookup("log-format") != nil && c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("--log-format must be text or json")
	}
	if fs.Lookup("task-lease") != nil && (c.TaskLease < time.Second || c.ProvisionTTL < c.TaskLease) {
		return fmt.Errorf("--task-lease must be >= 1s and --provision-ttl >= --task-lease")
	}
	if fs.Lookup("terminal-idle") != nil && (c.TerminalIdle < 10*time.Second || c.TerminalMaxPerTenant < 1 || c.TerminalMaxPerTenant > 1000) {
		return fmt.Errorf("--terminal-idle must be at least 10s and --terminal-max-per-tenant 1..1000")
	}
	if c.TerminalRecordDir != "" && !filepath.IsAbs(c.TerminalRecordDir) {
		return fmt.Errorf("--terminal-record-dir must be an absolute path")
	}
	if c.ReconcileInterval < 0 || (c.ReconcileInterval > 0 && c.ReconcileInterval < 10*time.Second) {
		return fmt.Errorf("--reconcile-interval must be 0 (off) or at least 10s")
	}
	if c.PprofListen != "" {
		host, _, err := net.SplitHostPort(c.PprofListen)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("--pprof-listen %q: want a loopback HOST:PORT such as 127.0.0.1:6060 (profiles are not authenticated)", c.PprofListen)
		}
	}
	if c.AdvertiseURL != "" {
		if err := checkAdvertiseURL(c.AdvertiseURL); err != nil {
			return err
		}
	}
	if fs.Lookup("gc-headroom-mib") != nil && (c.GCHeadroomMiB < 0 || c.GCHeadroomMiB > 4096) {
		return fmt.Errorf("--gc-headroom-mib must be 0 (Go's default) to 4096")
	}
	if fs.Lookup("max-procs") != nil {
		if _, err := parseMaxProcs(c.MaxProcs); err != nil {
			return err
		}
	}
	if c.EventRetention < 0 || (c.EventRetention > 0 && c.EventRetention < 24*time.Hour) {
		return fmt.Errorf("--event-retention must be 0 (keep forever) or at least 24h")
	}
	if fs.Lookup("max-db-conns") != nil && (c.MaxDBConns < 2 || c.MaxDBConns > 500) {
		return fmt.Errorf("--max-db-conns must be 2..500")
	}
	return nil
}

// checkAdvertiseURL accepts https://HOST[:PORT] and nothing else: other replicas dial it.
func checkAdvertiseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("--advertise-url %q: want https://HOST[:PORT], this replica's own address (not a load balancer's)", s)
	}
	return nil
}

// advertiseURL is the configured --advertise-url, or https:// and the address the listener
// got (the machine's hostname in place of an unspecified address).
func advertiseURL(cfg Config, bound net.Addr) (string, error) {
	if cfg.AdvertiseURL != "" {
		return strings.TrimRight(cfg.AdvertiseURL, "/"), nil
	}
	host, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("--advertise-url: no hostname to default to: %w", err)
		}
	}
	return "https://" + net.JoinHostPort(host, port), nil
}
