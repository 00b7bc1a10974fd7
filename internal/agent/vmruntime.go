package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gpuaas/gpuaas/internal/dhcpd"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/imagecache"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/telemetry"
)

// vmServices are the host services a VM runtime needs while hostd runs: the DHCP server on
// the slice bridge, the guest telemetry endpoint and the renewal of live slices' leases.
type vmServices struct {
	host      *slicevm.Host
	images    *imagecache.Cache
	bridgeIP  net.IP
	dhcp      *dhcpd.Server
	telemetry *telemetry.Registry
	hyper     hypervisor.Hypervisor
	addr      string
	log       *slog.Logger
}

// newVMRuntime builds the lab or libvirt runtime from the configuration.
func newVMRuntime(cfg Config, log *slog.Logger) (*slicevm.Host, *vmServices, error) {
	ip, network, err := net.ParseCIDR(cfg.BridgeAddress)
	if err != nil {
		return nil, nil, fmt.Errorf("bridge_address: %w", err)
	}
	if cfg.ImageCacheBudgetGiB < 0 {
		return nil, nil, fmt.Errorf("image_cache_budget_gib %d is negative", cfg.ImageCacheBudgetGiB)
	}
	// QEMU runs as an unprivileged user and must reach slices/<id>/{seed.iso,OVMF_VARS.fd}:
	// the data dir is traversable (0711) but not listable; secrets below it stay 0600/0700.
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, nil, err
	}
	if err := os.Chmod(cfg.DataDir, 0o711); err != nil {
		return nil, nil, err
	}
	hv, err := hypervisor.Connect(cfg.LibvirtSocket)
	if err != nil {
		return nil, nil, fmt.Errorf("libvirt at %s: %w (is libvirtd running?)", cfg.LibvirtSocket, err)
	}
	srv, err := dhcpd.New(dhcpd.Config{Interface: cfg.Bridge, ServerIP: ip, Netmask: network.Mask,
		StateFile: filepath.Join(cfg.DataDir, "dhcp", "reservations.json"), Logger: log})
	if err != nil {
		hv.Close()
		return nil, nil, err
	}
	ttl := leases.DefaultTTL
	if cfg.NodeSchedulerLeaseTTLSeconds > 0 {
		ttl = leases.TTLFromEnv(func(string) string { return strconv.Itoa(cfg.NodeSchedulerLeaseTTLSeconds) })
	}
	reg, err := telemetry.OpenRegistry(filepath.Join(cfg.StateDir, "telemetry"))
	if err != nil {
		hv.Close()
		return nil, nil, err
	}
	images := &imagecache.Cache{Dir: filepath.Join(cfg.DataDir, "slice-images"), MaxBytes: imagecache.DefaultMaxBytes,
		BudgetBytes: int64(cfg.ImageCacheBudgetGiB) << 30}
	h, err := slicevm.NewHost(slicevm.HostConfig{Lab: cfg.Runtime == "lab", DataDir: cfg.DataDir, FS: hostfs.New(cfg.HostRoot), Run: hostfs.Exec{},
		Hypervisor: hv, Leases: &leases.Dir{Path: filepath.Join(cfg.DataDir, "node-scheduler", "leases"), TTL: ttl},
		Images: images, DHCP: srv, Telemetry: reg, Bridge: cfg.Bridge, OVS: cfg.Runtime == "libvirt", LoaderPath: cfg.OVMFCode, VarsTemplate: cfg.OVMFVars,
		TerminalKeyPath: cfg.SliceTerminalSSHKeyPath, LibvirtSocket: cfg.LibvirtSocket, VFIOBind: cfg.SliceRuntimeVFIOBind, SoftwareCPU: cfg.LabHost, ReadinessTimeout: cfg.ReadinessTimeout, Log: log})
	if err != nil {
		hv.Close()
		return nil, nil, err
	}
	return h, &vmServices{host: h, images: images, bridgeIP: ip, dhcp: srv, telemetry: reg, hyper: hv, addr: cfg.TelemetryAddr, log: log}, nil
}

// start binds the DHCP server to the bridge and the telemetry listener and starts renewing
// leases; all stop with ctx.
func (s *vmServices) start(ctx context.Context) error {
	if err := s.dhcp.Listen(); err != nil {
		return err
	}
	go func() {
		if err := s.dhcp.Serve(); err != nil && ctx.Err() == nil {
			s.log.Error("DHCP server stopped", "err", err)
		}
	}()
	go func() { <-ctx.Done(); _ = s.dhcp.Close() }()
	go s.host.KeepLeases(ctx)
	if s.addr == "off" {
		return nil
	}
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("guest telemetry listen %s: %w", s.addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/internal/v1/guest-telemetry", s.telemetry.Handler())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("guest telemetry stopped", "err", err)
		}
	}()
	go func() { <-ctx.Done(); _ = hs.Close() }()
	// Guests reach the endpoint on the bridge address unless it listens on a specific one.
	host, port, _ := net.SplitHostPort(l.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = s.bridgeIP.String()
	}
	s.host.SetTelemetryURL("http://" + net.JoinHostPort(host, port) + "/internal/v1/guest-telemetry")
	s.log.Info("slice services up", "dhcp_interface", "bridge", "telemetry", l.Addr().String())
	return nil
}
