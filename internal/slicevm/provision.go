package slicevm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/internal/cloudinit"
	"github.com/gpuaas/gpuaas/internal/dhcpd"
	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/task"
)

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
		staged                   map[string]StagedImage // what was staged on the slots' disks, taken by this provision
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
			// The disks are this allocation's now: a staging on them stops and its record goes.
			staged = h.takeStaged(p.Bundles)
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
			// A SKU that requires signed images: the signature over the digest is checked
			// before anything is fetched or written (the digest check then ties the bytes to it).
			signed, err := verifyImageSignature(p)
			if err != nil {
				return "", err
			}
			// Pinned before the fetch: from here until release the cache keeps this image.
			if err := h.pinImage(p.AllocationID, p.Image.DigestSHA256); err != nil {
				return "", err
			}
			cleanup = append(cleanup, func() { _ = os.RemoveAll(dir) })
			var fresh bool
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
			return fmt.Sprintf("%s (%d bytes, %s)%s", p.Image.Slug, fi.Size(), map[bool]string{true: "downloaded", false: "cached"}[fresh], signed), nil
		}},
		{"image_digest_verify", func() (string, error) {
			// The cache hashes a file again only when its stamp (size, times, inode) changed
			// since its bytes were last hashed; a mismatching file is removed.
			hashed, err := h.cfg.Images.Verify(p.Image.DigestSHA256)
			if err != nil {
				return "", fmt.Errorf("%s: %w", p.Image.Slug, err)
			}
			if !hashed {
				return "sha256 " + p.Image.DigestSHA256[:16] + "… matches the catalog (verified when cached; file unchanged since)", nil
			}
			return "sha256 " + p.Image.DigestSHA256[:16] + "… matches the catalog", nil
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
				GuestDriverProfile: p.Profile.GuestDriverProfile, Validation: p.Validation})
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
			if why := stagedSkip(staged, boot, disks[0], p.Image.DigestSHA256); why != "" {
				return "", Skip(why)
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
			detail := fmt.Sprintf("%s defined and started (%d disks); %s", out.VMName, len(disks), placed)
			if !h.cfg.Lab {
				held, err := h.vfioHeld(out.VMName, p.Bundles)
				if err != nil {
					return "", err
				}
				detail += "; " + held
			}
			return detail, nil
		}},
		{"readiness", func() (string, error) {
			if h.cfg.SoftwareCPU {
				return "", Skip(softwareCPUSkip)
			}
			return h.readiness(ctx, p, signer, started, dir)
		}},
		{"performance_probe", func() (string, error) {
			if h.cfg.SoftwareCPU {
				return "", Skip(softwareCPUSkip)
			}
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

// verifyImageSignature checks the image's publisher signature when its SKU requires signed
// images (nothing otherwise). It returns a note for the phase detail naming the key.
func verifyImageSignature(p *task.VMProvision) (string, error) {
	if !p.Image.SignatureRequired {
		return "", nil
	}
	name, err := imagesig.Verify(p.ImageKeys, p.Image.DigestSHA256, p.Image.Signature)
	if err != nil {
		return "", fmt.Errorf("image %s refused before download: its SKU requires signed images: %w", p.Image.Slug, err)
	}
	return ", signature by " + name + " verified", nil
}
