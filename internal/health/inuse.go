package health

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// HeldOpen says which of the PCI functions a process on this host has in use: a VM that has a
// device passed through holds its IOMMU group's /dev/vfio/N open for as long as it runs. Each
// entry reads "0000:1b:00.0: VFIO group 7 open in pid 4242 (qemu-system-x86)". A validation
// resets the functions it checks, so a function held here must not be validated: the reset
// would hit the VM's device. It reads /proc/*/fd through the host root (fixture trees work).
func HeldOpen(fs hostfs.FS, functions []string) []string {
	groups := map[string]string{} // VFIO group -> function
	for _, addr := range functions {
		if addr == "" {
			continue
		}
		if g := fs.LinkBase("/sys/bus/pci/devices/" + addr + "/iommu_group"); g != "" {
			groups[g] = addr
		}
	}
	if len(groups) == 0 {
		return nil
	}
	procs, _ := fs.ReadDir("/proc")
	var out []string
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := "/proc/" + p.Name() + "/fd"
		fds, _ := fs.ReadDir(dir)
		seen := map[string]bool{}
		for _, fd := range fds {
			t, err := fs.Readlink(dir + "/" + fd.Name())
			if err != nil || !strings.HasPrefix(t, "/dev/vfio/") {
				continue
			}
			g := path.Base(t)
			if addr, ok := groups[g]; ok && !seen[g] {
				seen[g] = true
				comm, _ := fs.ReadFile("/proc/" + p.Name() + "/comm")
				out = append(out, fmt.Sprintf("%s: VFIO group %s open in pid %d (%s)", addr, g, pid, strings.TrimSpace(string(comm))))
			}
		}
	}
	sort.Strings(out)
	return out
}
