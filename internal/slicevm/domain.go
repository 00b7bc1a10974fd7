package slicevm

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpuaas/gpuaas/internal/domainxml"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/task"
)

// DomainXML builds the domain of a plan: production (KVM, passthrough, per-slot pinning,
// strict memory binding, guest NUMA cells) or lab (emulated, no passthrough, Linux bridge,
// binding and pinning only to what the lab host has). The summary says where vCPUs, threads
// and memory went.
func (h *Host) DomainXML(p *task.VMProvision, disks []string, seedISO, nvram string) ([]byte, string, error) {
	return BuildDomain(DomainInput{Plan: p, Disks: disks, SeedISO: seedISO, NVRAM: nvram, Lab: h.cfg.Lab, SoftwareCPU: h.cfg.SoftwareCPU, ConsoleLog: filepath.Join(filepath.Dir(seedISO), "console.log"),
		Bridge: h.cfg.Bridge, OVS: h.cfg.OVS, Loader: h.cfg.LoaderPath, FS: h.cfg.FS})
}

// DomainInput is everything BuildDomain needs.
type DomainInput struct {
	Plan    *task.VMProvision
	Disks   []string // resolved slot disks, boot first (defaults to the plan's NVMe paths)
	SeedISO string
	NVRAM   string
	// ConsoleLog keeps a copy of the serial console (optional).
	ConsoleLog  string
	Lab         bool
	SoftwareCPU bool // domain type qemu with passthrough kept (HostConfig.SoftwareCPU)
	Bridge      string
	OVS         bool
	Loader      string
	FS          hostfs.FS // the host's NUMA nodes and their CPUs (/sys/devices/system/node)
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
		MAC: p.Bundles[0].MACAddress, Bridge: in.Bridge, OVS: in.OVS && !in.Lab, Emulated: in.Lab, SoftwareCPU: in.SoftwareCPU, LabOffloadOff: in.Lab,
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
