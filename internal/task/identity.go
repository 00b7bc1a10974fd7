package task

import (
	"fmt"
	"net"
	"regexp"
	"strings"
)

// Device and PCI identities travel inside signed payloads and end up in sysfs paths
// (/sys/bus/pci/devices/<addr>/driver_override) and block-device opens. A signature proves
// who sent a payload, not that its values are safe: the host also refuses identities that are
// not well formed, so a bad row in the controller's database cannot steer a host write.
var (
	pciAddrRE = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	byIDRE    = regexp.MustCompile(`^/dev/disk/by-id/[A-Za-z0-9][A-Za-z0-9._:+@-]{0,200}$`)
	devRE     = regexp.MustCompile(`^/dev/[A-Za-z0-9][A-Za-z0-9._:+@-]*(/[A-Za-z0-9][A-Za-z0-9._:+@-]*)*$`)
	macAddrRE = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	safeIDRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// CheckPCIAddress accepts a PCI function address such as 0000:1b:00.0 (lowercase hex).
func CheckPCIAddress(addr string) error {
	if !pciAddrRE.MatchString(addr) {
		return fmt.Errorf("PCI address %q must look like 0000:1b:00.0", addr)
	}
	return nil
}

// CheckByIDPath accepts a stable disk identity: one /dev/disk/by-id/ name, never a
// /dev/nvmeXnY name that can move between boots, and never a path that climbs.
func CheckByIDPath(p string) error {
	if !byIDRE.MatchString(p) || strings.Contains(p, "..") {
		return fmt.Errorf("device %q must be a stable /dev/disk/by-id/ name", p)
	}
	return nil
}

// CheckDevicePath accepts a plain /dev path (by-id preferred): no "..", no empty or hidden
// elements, no whitespace or control characters.
func CheckDevicePath(p string) error {
	if len(p) > 256 || !devRE.MatchString(p) || strings.Contains(p, "..") {
		return fmt.Errorf("device %q must be a plain /dev path (prefer /dev/disk/by-id)", p)
	}
	return nil
}

// CheckSafeID accepts an identifier that is also safe as a file name and a log field.
func CheckSafeID(what, id string) error {
	if !safeIDRE.MatchString(id) {
		return fmt.Errorf("%s %q is not a safe identifier", what, id)
	}
	return nil
}

func (b Bundle) check() error {
	for _, a := range []string{b.GPUPCI, b.FabricParentPCI, b.FabricVFPCI} {
		if a != "" {
			if err := CheckPCIAddress(a); err != nil {
				return fmt.Errorf("slot %d: %w", b.SlotIndex, err)
			}
		}
	}
	if b.NVMeDevice != "" {
		if err := CheckByIDPath(b.NVMeDevice); err != nil {
			return fmt.Errorf("slot %d: %w", b.SlotIndex, err)
		}
	}
	if b.MACAddress != "" && !macAddrRE.MatchString(b.MACAddress) {
		return fmt.Errorf("slot %d: MAC %q must be lowercase aa:bb:cc:dd:ee:ff", b.SlotIndex, b.MACAddress)
	}
	if b.PrivateIP != "" && net.ParseIP(b.PrivateIP).To4() == nil {
		return fmt.Errorf("slot %d: private IP %q is not IPv4", b.SlotIndex, b.PrivateIP)
	}
	// A disk this host could not erase by its slot's policy is never handed to a tenant.
	if b.WipePolicy != "" {
		if err := CheckWipePolicy(b.WipePolicy); err != nil {
			return fmt.Errorf("slot %d: %w", b.SlotIndex, err)
		}
	}
	if b.SlotID != "" {
		return CheckSafeID("slot id", b.SlotID)
	}
	return nil
}

func checkBundles(allocationID string, bs []Bundle) error {
	if err := CheckSafeID("allocation id", allocationID); err != nil {
		return err
	}
	for _, b := range bs {
		if err := b.check(); err != nil {
			return err
		}
	}
	return nil
}

// checker is a payload whose identities the host checks after decoding.
type checker interface{ check() error }

func (p *VMProvision) check() error { return checkBundles(p.AllocationID, p.Bundles) }
func (p *VMRelease) check() error   { return checkBundles(p.AllocationID, p.Bundles) }

func (p *Reconcile) check() error {
	for _, a := range p.Allocations {
		if err := checkBundles(a.AllocationID, a.Bundles); err != nil {
			return err
		}
	}
	return nil
}

func (p *StorageTransition) check() error {
	for _, d := range p.Devices {
		if err := CheckDevicePath(d); err != nil {
			return err
		}
	}
	return nil
}

func (p *WipeVerify) check() error {
	if err := CheckByIDPath(p.Device); err != nil {
		return err
	}
	if p.Policy != "" {
		if err := CheckWipePolicy(p.Policy); err != nil {
			return err
		}
	}
	return CheckSafeID("slot id", p.SlotID)
}

func (p *TerminalOpen) check() error {
	if err := CheckSafeID("session id", p.SessionID); err != nil {
		return err
	}
	return CheckSafeID("allocation id", p.AllocationID)
}
