// Package prereq checks a host's slice prerequisites (seed 001 "Host Bootstrap And
// Prerequisites") through the host seam and says how to fix each failure. It only reads:
// installing or configuring is the bootstrap's job, never the check's.
package prereq

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// Check is one prerequisite.
type Check struct {
	Name        string `json:"name"`
	OK          bool   `json:"ok"`
	Detail      string `json:"detail"`
	Remediation string `json:"remediation,omitempty"`
}

// Report is the result of all checks.
type Report struct {
	Ready  bool     `json:"ready"`
	Failed []string `json:"failed,omitempty"`
	Checks []Check  `json:"checks"`
}

// Options tune the checks.
type Options struct {
	Bridge       string // OVS bridge slices attach to (default ovsbr0)
	HugepagesGiB int    // 1 GiB hugepages the host's profiles need free (0: not required)
	// Lab is the lab runtime: software emulation without passthrough. kvm, iommu and
	// vfio_pci are reported as not applicable (ok, saying so) and the bridge may be a Linux
	// bridge. Production hosts never set it.
	Lab bool
	// LabHost is the lab host VM (hostd --lab-host, a simulated host): an IOMMU and devices
	// but no KVM; kvm is reported as not applicable (its slice VMs run under software
	// emulation). Every other check stays.
	LabHost bool
}

// Run runs every check.
func Run(fs hostfs.FS, o Options) Report {
	if o.Bridge == "" {
		o.Bridge = "ovsbr0"
	}
	checks := []Check{
		exists(fs, "kvm", "/dev/kvm", "enable VT-x/AMD-V in firmware and load kvm_intel or kvm_amd"),
		iommu(fs),
		vfio(fs),
		exists(fs, "ovs_bridge", "/sys/class/net/"+o.Bridge, "create the OVS bridge "+o.Bridge+" (host bootstrap)"),
		libvirt(fs),
		anyOf(fs, "ovmf", []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/ovmf/OVMF.fd"},
			"apt-get install ovmf (UEFI firmware for slice VMs)"),
		anyOf(fs, "qemu_img", []string{"/usr/bin/qemu-img"}, "apt-get install qemu-utils"),
		hugepages(fs, o.HugepagesGiB),
		rebootRequired(fs),
	}
	if o.Lab {
		for i, c := range checks {
			switch c.Name {
			case "kvm", "iommu", "vfio_pci":
				if !c.OK {
					checks[i] = Check{Name: c.Name, OK: true, Detail: "not applicable: lab host (software emulation, no passthrough); here: " + c.Detail}
				}
			case "ovs_bridge":
				checks[i].Name = "slice_bridge"
			}
		}
	}
	if o.LabHost {
		for i, c := range checks {
			if c.Name == "kvm" && !c.OK {
				checks[i] = Check{Name: c.Name, OK: true, Detail: "not applicable: lab host VM (simulated; slice VMs under software emulation); here: " + c.Detail}
			}
		}
	}
	r := Report{Ready: true, Checks: checks}
	for _, c := range checks {
		if !c.OK {
			r.Ready = false
			r.Failed = append(r.Failed, c.Name)
		}
	}
	return r
}

func exists(fs hostfs.FS, name, p, fix string) Check {
	if fs.Exists(p) {
		return Check{Name: name, OK: true, Detail: p + " present"}
	}
	return Check{Name: name, Detail: p + " missing", Remediation: fix}
}

func anyOf(fs hostfs.FS, name string, paths []string, fix string) Check {
	for _, p := range paths {
		if fs.Exists(p) {
			return Check{Name: name, OK: true, Detail: p + " present"}
		}
	}
	return Check{Name: name, Detail: "none of " + strings.Join(paths, ", "), Remediation: fix}
}

func iommu(fs hostfs.FS) Check {
	c := Check{Name: "iommu"}
	cmdline, _ := fs.ReadFile("/proc/cmdline")
	groups, _ := fs.ReadDir("/sys/kernel/iommu_groups")
	on := strings.Contains(string(cmdline), "intel_iommu=on") || strings.Contains(string(cmdline), "amd_iommu=on") ||
		strings.Contains(string(cmdline), "iommu=pt")
	c.Detail = fmt.Sprintf("kernel cmdline iommu flags: %v; %d IOMMU groups", on, len(groups))
	c.OK = len(groups) > 0
	if !c.OK {
		c.Remediation = "add intel_iommu=on iommu=pt (or amd_iommu=on iommu=pt) to the kernel command line and reboot"
	}
	return c
}

func vfio(fs hostfs.FS) Check {
	if fs.Exists("/sys/bus/pci/drivers/vfio-pci") || fs.Exists("/sys/module/vfio_pci") {
		return Check{Name: "vfio_pci", OK: true, Detail: "vfio-pci driver available"}
	}
	return Check{Name: "vfio_pci", Detail: "vfio-pci driver not loaded", Remediation: "modprobe vfio-pci and list it in /etc/modules-load.d/"}
}

func libvirt(fs hostfs.FS) Check {
	const sock = "/run/libvirt/libvirt-sock"
	c := Check{Name: "libvirt"}
	p, err := fs.Path(sock)
	if err == nil {
		var conn net.Conn
		if conn, err = net.DialTimeout("unix", p, time.Second); err == nil {
			conn.Close()
			return Check{Name: "libvirt", OK: true, Detail: sock + " answers"}
		}
	}
	c.Detail = sock + " does not answer: " + err.Error()
	c.Remediation = "start libvirtd (systemctl enable --now libvirtd)"
	return c
}

func hugepages(fs hostfs.FS, needGiB int) Check {
	nodes, _ := fs.Glob("/sys/devices/system/node/node[0-9]*")
	free := 0
	for _, n := range nodes {
		b, _ := fs.ReadFile(n + "/hugepages/hugepages-1048576kB/free_hugepages")
		v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		free += v
	}
	c := Check{Name: "hugepages_1g", OK: free >= needGiB, Detail: fmt.Sprintf("%d free 1 GiB hugepages, %d needed", free, needGiB)}
	if !c.OK {
		c.Remediation = "reserve 1 GiB hugepages (default_hugepagesz=1G hugepagesz=1G hugepages=N) and reboot"
	}
	return c
}

func rebootRequired(fs hostfs.FS) Check {
	markers, _ := fs.Glob("/var/lib/gpuaas/site-bootstrap/*.reboot-required")
	if len(markers) == 0 {
		return Check{Name: "reboot_required", OK: true, Detail: "no pending reboot"}
	}
	return Check{Name: "reboot_required", Detail: "pending: " + strings.Join(markers, ", "),
		Remediation: "reboot the host so the bootstrap changes take effect (drain it first)"}
}
