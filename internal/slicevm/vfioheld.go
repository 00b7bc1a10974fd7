package slicevm

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/task"
)

// qemuPIDFile is where libvirtd's QEMU driver records a running domain's QEMU process.
func qemuPIDFile(domain string) string { return "/run/libvirt/qemu/" + domain + ".pid" }

// vfioHeld checks that the domain's QEMU process holds the VFIO group of every GPU and VF of
// the bundles open (/proc/PID/fd -> /dev/vfio/N): the devices are really passed through,
// not merely named in the definition. It returns the pid and the groups it saw.
func (h *Host) vfioHeld(domain string, bs []task.Bundle) (string, error) {
	raw, err := h.cfg.FS.ReadFile(qemuPIDFile(domain))
	if err != nil {
		return "", fmt.Errorf("QEMU of %s: no pid file: %w", domain, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		return "", fmt.Errorf("QEMU of %s: pid file says %q", domain, strings.TrimSpace(string(raw)))
	}
	fds, err := h.cfg.FS.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return "", fmt.Errorf("QEMU of %s (pid %d): %w", domain, pid, err)
	}
	open := map[string]bool{}
	for _, fd := range fds {
		if t, err := h.cfg.FS.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name()); err == nil && strings.HasPrefix(t, "/dev/vfio/") {
			open[path.Base(t)] = true
		}
	}
	var held, missing []string
	for _, b := range bs {
		for _, addr := range []string{b.GPUPCI, b.FabricVFPCI} {
			if addr == "" {
				continue
			}
			grp := h.cfg.FS.LinkBase("/sys/bus/pci/devices/" + addr + "/iommu_group")
			switch {
			case grp == "":
				missing = append(missing, addr+" (no IOMMU group)")
			case open[grp]:
				held = append(held, grp)
			default:
				missing = append(missing, addr+" (group "+grp+")")
			}
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("QEMU of %s (pid %d) does not hold the VFIO group of %s", domain, pid, strings.Join(missing, ", "))
	}
	sort.Strings(held)
	return fmt.Sprintf("QEMU pid %d holds VFIO groups %s", pid, strings.Join(held, ", ")), nil
}
