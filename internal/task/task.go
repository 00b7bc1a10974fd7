// Package task defines the typed tasks the controller sends to hosts and the signed
// envelope that carries them. Both sides share these types: there is no generic shell task,
// ever; every type has a typed payload and a typed output. The controller signs an
// envelope with its ed25519 task-signing key; hostd verifies signature, node binding,
// validity window, known type and replay before running anything.
package task

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/internal/imagesig"
)

// Type names a task kind.
type Type string

// The task types. Adding one means adding its payload and output types below and a handler
// on the host.
const (
	TypeTopologyDiscover Type = "slice.topology_discover"
	TypeStorageTransit   Type = "slice.storage_transition"
	TypeVMProvision      Type = "slice.vm_provision"
	TypeVMRelease        Type = "slice.vm_release"
	TypeReconcile        Type = "slice.reconcile"
	TypeTerminalOpen     Type = "terminal.open"
	TypePrereqCheck      Type = "host.prereq_check"
	TypeWipeVerify       Type = "slot.wipe_verify"
	TypeSlotValidate     Type = "slot.validate"
	TypeImageStage       Type = "slot.image_stage"
)

// Known reports whether t is a task type this build understands.
func Known(t Type) bool {
	_, ok := payloadTypes[t]
	return ok
}

// Bundle is one slot of an accepted placement plan (seed 004 "GPU Slice Bundle Model").
type Bundle struct {
	SlotID          string `json:"slot_id"`
	SlotIndex       int    `json:"slot_index"`
	GPUPCI          string `json:"gpu_pci"`
	FabricParentPCI string `json:"fabric_parent_pci,omitempty"`
	FabricVFPCI     string `json:"fabric_vf_pci"`
	NVMeDevice      string `json:"nvme_device"`
	NUMANode        *int   `json:"numa_node"`
	MACAddress      string `json:"mac_address"`
	PrivateIP       string `json:"private_ip"`
	WipePolicy      string `json:"destructive_wipe_policy"`
	// DiskIdentity is the slot disk's recorded identity ("serial:...", "wwn:...", "eui64:...",
	// "nguid:..."; capacity_metadata.disk_identity), empty when none is recorded: hostd reads
	// the device's own identity and refuses to wipe or prove a different disk.
	DiskIdentity string `json:"disk_identity,omitempty"`
	VCPUCount    int    `json:"vcpu_count,omitempty"`
	MemoryMiB    int    `json:"memory_mib,omitempty"`
	// HostCPUs is the slot's own host CPU set (cpulist form, internal/cpuset): the VM's vCPUs
	// are pinned inside the union of its bundles' sets, never outside.
	HostCPUs string `json:"host_cpus,omitempty"`
}

// Image is the boot image of a slice, pinned by digest.
type Image struct {
	ID           string `json:"id"`
	Slug         string `json:"slug"`
	SourceType   string `json:"source_type"`
	SourceRef    string `json:"source_ref"`
	DigestSHA256 string `json:"digest_sha256"`
	Format       string `json:"image_format"`
	Username     string `json:"default_username"`
	// Signature is the publisher's detached ed25519 signature over DigestSHA256 (imagesig).
	Signature string `json:"signature,omitempty"`
	// SignatureRequired says the SKU requires signed images: the host refuses an image whose
	// signature no key in VMProvision.ImageKeys verifies, before fetching it or writing a
	// byte of it to a disk.
	SignatureRequired bool `json:"signature_required,omitempty"`
}

// Profile is the resolved VM shape.
type Profile struct {
	Name      string          `json:"name"`
	GPUCount  int             `json:"gpu_count"`
	VCPUCount int             `json:"vcpu_count"`
	MemoryMiB int             `json:"memory_mib"`
	Hugepages json.RawMessage `json:"hugepages,omitempty"`
	// GuestDriverProfile names the guest driver install run at first boot (cloudinit.DriverProfiles).
	GuestDriverProfile string `json:"guest_driver_profile,omitempty"`
}

// VMProvision is the payload of slice.vm_provision: the whole accepted plan.
type VMProvision struct {
	AllocationID  string   `json:"allocation_id"`
	Bundles       []Bundle `json:"bundles"`
	Profile       Profile  `json:"profile"`
	Image         Image    `json:"image"`
	SSHPublicKeys []string `json:"ssh_public_keys,omitempty"`
	// HousekeepingCPUs is the host's CPU set kept back from slots (cpulist form): the VM's
	// emulator and I/O threads are pinned there, off every slot's CPUs.
	HousekeepingCPUs string `json:"housekeeping_cpus,omitempty"`
	// ImageKeys are the publisher keys the controller trusts; this task's signature carries
	// them to the host, which checks Image.Signature against them.
	ImageKeys []imagesig.Key `json:"image_keys,omitempty"`
	// Validation makes the guest a burn-in validation VM: its seed carries the validation
	// script, which reports through the guest telemetry channel (slot.validate sets it).
	Validation bool `json:"validation,omitempty"`
}

// VMRelease is the payload of slice.vm_release.
type VMRelease struct {
	AllocationID     string   `json:"allocation_id"`
	Bundles          []Bundle `json:"bundles"`
	Wipe             bool     `json:"wipe"`
	GracefulTimeoutS int      `json:"graceful_timeout_s"`
}

// TopologyDiscover is the payload of slice.topology_discover.
type TopologyDiscover struct {
	IncludeHugepages bool `json:"include_hugepages"`
}

// StorageTransition is the payload of slice.storage_transition.
type StorageTransition struct {
	Devices []string `json:"devices"` // /dev/disk/by-id paths
	To      string   `json:"to"`      // slice
	Apply   bool     `json:"apply"`   // false = dry run
	Node    string   `json:"node"`    // the node name: the host's confirmation for apply
}

// WipeVerify is the payload of slot.wipe_verify: erase one slot's disk and prove it.
type WipeVerify struct {
	SlotID       string `json:"slot_id"`
	Device       string `json:"device"` // /dev/disk/by-id path
	Apply        bool   `json:"apply"`
	Policy       string `json:"destructive_wipe_policy,omitempty"` // empty: blkdiscard_zero_verify
	DiskIdentity string `json:"disk_identity,omitempty"`           // as Bundle.DiskIdentity
}

// SlotValidate is the payload of slot.validate: check one slot's devices before it is sold
// again (docs/health.md). Level "quick": each PCI function present, config space readable, its
// link at full width, no AER fatal or non-fatal errors, then a function reset read back.
// Level "burn-in": the quick checks, then a validation VM booted on the slot's devices from
// BurnIn's plan, whose guest runs nvidia-smi and dcgmi and reports through the guest telemetry
// channel; the VM is then released and the slot's disk wiped and verified again.
type SlotValidate struct {
	SlotID   string `json:"slot_id"`
	Level    string `json:"level"` // quick | burn-in
	GPUPCI   string `json:"gpu_pci"`
	FabricVF string `json:"fabric_vf_pci,omitempty"`
	// BurnIn is the validation VM's plan (level burn-in): one bundle, this slot's.
	BurnIn *VMProvision `json:"burn_in,omitempty"`
	// BurnInTimeoutS bounds the wait for the guest's validation report (default 600).
	BurnInTimeoutS int `json:"burn_in_timeout_s,omitempty"`
}

// Reconcile is the payload of slice.reconcile: what the controller believes runs on the
// node. The host compares it with libvirt, leases, DHCP reservations and disks.
type Reconcile struct {
	Allocations []ReconcileAllocation `json:"allocations"`
}

// ReconcileAllocation is one live slice allocation the controller expects on the node.
type ReconcileAllocation struct {
	AllocationID string   `json:"allocation_id"`
	Status       string   `json:"status"` // provisioning | active | releasing
	Bundles      []Bundle `json:"bundles"`
}

// ReconcileReport is slice.reconcile's output: per-slot drift and host objects no
// allocation accounts for.
type ReconcileReport struct {
	Runtime            string      `json:"runtime"`
	Simulated          bool        `json:"simulated"`
	Slots              []SlotDrift `json:"slots"`
	OrphanDomains      []string    `json:"orphan_domains"`      // gpuaas-* domains of no live allocation
	OrphanLeases       []string    `json:"orphan_leases"`       // slot ids leased by no live allocation
	OrphanReservations []string    `json:"orphan_reservations"` // MACs reserved for no live allocation
	CheckedAt          time.Time   `json:"checked_at"`
}

// SlotDrift is one expected slot's state on the host.
type SlotDrift struct {
	SlotID       string   `json:"slot_id"`
	SlotIndex    int      `json:"slot_index"`
	AllocationID string   `json:"allocation_id"`
	DomainState  string   `json:"domain_state"` // running | shutoff | not_found | ...
	Drift        []string `json:"drift,omitempty"`
	// GuestTelemetryAt is when the slice's guest last reported telemetry to this hostd
	// (absent: not since hostd started). Informational: a tenant may stop the helper.
	GuestTelemetryAt *time.Time `json:"guest_telemetry_at,omitempty"`
}

// PrereqCheck is the payload of host.prereq_check.
type PrereqCheck struct {
	HugepagesGiB int    `json:"hugepages_gib"`
	Bridge       string `json:"bridge,omitempty"`
}

// TerminalOpen is the payload of terminal.open.
type TerminalOpen struct {
	SessionID    string `json:"session_id"`
	AllocationID string `json:"allocation_id"`
	Mode         string `json:"mode"` // terminal | stdio | console
	// HostToken authenticates hostd's attach (with its node certificate); single use.
	HostToken string `json:"host_token"`
	// AttachPath is where hostd opens its outbound stream for this session.
	AttachPath string `json:"attach_path"`
	GuestIP    string `json:"guest_ip"`
	Username   string `json:"username"`
	Command    string `json:"command,omitempty"`
	Cols       int    `json:"cols,omitempty"`
	Rows       int    `json:"rows,omitempty"`
}

// TerminalOutput is terminal.open's result.
type TerminalOutput struct {
	Mode       string `json:"mode"`
	ExitStatus *int   `json:"exit_status,omitempty"`
	BytesIn    int64  `json:"bytes_in"`
	BytesOut   int64  `json:"bytes_out"`
}

// ImageStage is the payload of slot.image_stage: write Image onto an idle slot's disk, wiped
// and proven clean since its last tenant, so the next provision of that image on it skips
// the disk write (warm slots, docs/images.md). The host refuses a disk a lease holds.
type ImageStage struct {
	SlotID       string `json:"slot_id"`
	Device       string `json:"device"` // /dev/disk/by-id path
	DiskIdentity string `json:"disk_identity,omitempty"`
	Image        Image  `json:"image"`
	// ImageKeys are the trusted publisher keys when Image.SignatureRequired (as VMProvision).
	ImageKeys []imagesig.Key `json:"image_keys,omitempty"`
	// AfterWipeProof is the slot's verified wipe proof (slot_wipe_proofs id) the staging
	// follows: the controller records the staging against it, and only while it is the latest.
	AfterWipeProof int64 `json:"after_wipe_proof"`
}

var payloadTypes = map[Type]func() any{
	TypeTopologyDiscover: func() any { return &TopologyDiscover{} },
	TypeStorageTransit:   func() any { return &StorageTransition{} },
	TypeVMProvision:      func() any { return &VMProvision{} },
	TypeVMRelease:        func() any { return &VMRelease{} },
	TypeReconcile:        func() any { return &Reconcile{} },
	TypeTerminalOpen:     func() any { return &TerminalOpen{} },
	TypePrereqCheck:      func() any { return &PrereqCheck{} },
	TypeWipeVerify:       func() any { return &WipeVerify{} },
	TypeSlotValidate:     func() any { return &SlotValidate{} },
	TypeImageStage:       func() any { return &ImageStage{} },
}

// DecodePayload decodes an envelope's payload into the type's struct, rejecting unknown
// fields so a payload from a newer controller is never half-understood.
func DecodePayload(t Type, raw json.RawMessage) (any, error) {
	mk, ok := payloadTypes[t]
	if !ok {
		return nil, fmt.Errorf("unknown task type %q", t)
	}
	v := mk()
	if err := strictUnmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("%s payload: %w", t, err)
	}
	return v, nil
}

// ProvisionPhases are the 17 phases of slice.vm_provision, in order (seed 000).
var ProvisionPhases = []string{
	"lease_acquire", "host_dependencies", "host_passthrough_check", "vfio_bind_check", "image_stat_download",
	"image_digest_verify", "cloud_init_dir", "terminal_key", "guest_telemetry_register", "cloud_init_seed_files",
	"seed_iso", "runtime_validate", "dhcp_reservation", "image_write_convert", "domain_define_start", "readiness",
	"performance_probe",
}

// ReleasePhases are the phases of slice.vm_release (seed 000 "Release").
var ReleasePhases = []string{"shutdown", "undefine", "vfio_rebind", "cloud_init_cleanup", "dhcp_release", "wipe_verify", "lease_release"}

// PhasesOf are a task type's phases in order (nil when it has no fixed list).
func PhasesOf(t string) []string {
	switch Type(t) {
	case TypeVMProvision:
		return ProvisionPhases
	case TypeVMRelease:
		return ReleasePhases
	}
	return nil
}

// Phase is one timed step of a task's execution.
type Phase struct {
	Name       string    `json:"name"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS int64     `json:"duration_ms"`
	Status     string    `json:"status"` // ok | failed | skipped
	Error      string    `json:"error,omitempty"`
	Detail     string    `json:"detail,omitempty"` // what the phase did, or why it was skipped
}

// Result is what a host reports for a task.
type Result struct {
	TaskID  string          `json:"task_id"`
	Attempt int             `json:"attempt"`
	Status  string          `json:"status"` // succeeded | failed | refused
	Output  json.RawMessage `json:"output,omitempty"`
	Phases  []Phase         `json:"phases"`
	Error   string          `json:"error,omitempty"`
	// Reason classifies a failure for the controller, e.g. plan_invalid: the host no longer
	// matches the controller's plan (device gone, disk mounted, lease held).
	Reason string `json:"reason,omitempty"`
}

// Batch is the body of a poll that asked for several tasks (GET /api/v1/agent/tasks?max=N).
type Batch struct {
	Tasks []*Envelope `json:"tasks"`
}
