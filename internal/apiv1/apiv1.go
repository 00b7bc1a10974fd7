// Package apiv1 holds the request and response types of the controller's /api/v1 HTTP API.
// Both the controller and its clients (gpuaasctl, tests) use them, so the JSON field names
// here are the stable contract operators' scripts rely on: rename nothing.
package apiv1

import (
	"encoding/json"
	"time"
)

// Error codes returned in Error.Code. Each maps to one HTTP status and one CLI exit code.
const (
	CodeInvalidRequest    = "invalid_request"
	CodeUnauthorized      = "unauthorized"
	CodeForbidden         = "forbidden"
	CodeNotFound          = "not_found"
	CodeConflict          = "conflict"
	CodeSKUUnavailable    = "sku_unavailable"
	CodeTooLarge          = "payload_too_large"
	CodeUnavailable       = "unavailable" // retryable: database unreachable, shutting down
	CodeInternal          = "internal"
	CodeIdempotencyReused = "idempotency_key_reused"
	CodeRateLimited       = "rate_limited" // 429; details.retry_after_seconds, header Retry-After
)

// Reasons carried in Error.Details["reason"] with CodeSKUUnavailable.
const (
	ReasonCountNotAllowed     = "count_not_allowed"
	ReasonNoCapacity          = "no_capacity"
	ReasonTopologyFragmented  = "topology_fragmented"
	ReasonFabricPolicyBlocked = "fabric_policy_blocked"
	ReasonNodeDraining        = "node_draining"
	ReasonSKUInactive         = "sku_inactive"
	ReasonNoImage             = "no_viable_image"
	// ReasonSimulatedHosts: the only capacity is on hosts running the sim runtime, which a
	// controller sells only when started with --allow-simulated-hosts.
	ReasonSimulatedHosts = "simulated_hosts_only"
)

// Error is the body of every non-2xx response.
type Error struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// SKU is a sellable product (sku_catalog row).
type SKU struct {
	SKU                 string          `json:"sku"`
	Vendor              string          `json:"vendor"`
	DisplayName         string          `json:"display_name"`
	AcceleratorModel    string          `json:"accelerator_model"`
	CapacityShape       string          `json:"capacity_shape"`
	GPUsTotal           int             `json:"gpus_total"`
	AllowedGPUCounts    []int           `json:"allowed_gpu_counts"`
	GPUHourlyPriceMinor int64           `json:"gpu_hourly_price_minor"`
	Currency            string          `json:"currency"`
	NetworkFabric       string          `json:"network_fabric"`
	ExclusiveNode       bool            `json:"exclusive_node"`
	ResourceProfile     json.RawMessage `json:"resource_profile"`
	// ValidationPolicy is what runs on a slot of this SKU after its wipe and before it is sold
	// again: none, quick or burn-in (docs/health.md).
	ValidationPolicy string    `json:"validation_policy,omitempty"`
	Active           bool      `json:"active"`
	CreatedAt        time.Time `json:"created_at"`
	UpdatedAt        time.Time `json:"updated_at"`
	// RequiresSignedImages: this SKU's slices boot only images whose publisher signature a
	// trusted key verifies (checked by the controller at create and by the host before it
	// writes the image).
	RequiresSignedImages bool `json:"requires_signed_images"`
	// WarmSlots: hosts write this SKU's default image onto its idle slots' disks after each
	// wipe proof, so a provision of that image skips the disk write (docs/images.md).
	WarmSlots bool `json:"warm_slots"`
}

// SKUPatch updates mutable SKU fields; nil fields are left as they are.
type SKUPatch struct {
	DisplayName          *string          `json:"display_name,omitempty"`
	AllowedGPUCounts     []int            `json:"allowed_gpu_counts,omitempty"`
	GPUHourlyPriceMinor  *int64           `json:"gpu_hourly_price_minor,omitempty"`
	ResourceProfile      *json.RawMessage `json:"resource_profile,omitempty"`
	ValidationPolicy     *string          `json:"validation_policy,omitempty"`
	Active               *bool            `json:"active,omitempty"`
	RequiresSignedImages *bool            `json:"requires_signed_images,omitempty"`
	WarmSlots            *bool            `json:"warm_slots,omitempty"`
}

// Node modes derived from admin intent, readiness, slots and live claims (seed 001 "Mixed Node State").
const (
	ModeBaremetalOnly   = "baremetal_only"
	ModeSliceCandidate  = "slice_candidate"
	ModeBothCapable     = "both_capable"
	ModeBaremetalActive = "baremetal_active"
	ModeSliceActive     = "slice_active"
	ModeDraining        = "draining"
	ModeCleanupBlocked  = "cleanup_blocked"
	ModeUnavailable     = "unavailable"
	ModeUnreachable     = "unreachable" // agent heartbeat missing or stale: no new placements
)

// Node is a physical GPU server.
type Node struct {
	ID              string          `json:"id"`
	Name            string          `json:"name"`
	Status          string          `json:"status"`
	Draining        bool            `json:"draining"`
	Region          string          `json:"region"`
	TenantID        string          `json:"tenant_id,omitempty"`
	SKU             string          `json:"sku,omitempty"`
	SliceSKU        string          `json:"slice_sku,omitempty"`
	ProfileTags     []string        `json:"profile_tags"`
	HardwareTags    []string        `json:"hardware_tags"`
	FirmwareProfile json.RawMessage `json:"firmware_profile"`
	AgentFacts      json.RawMessage `json:"agent_facts"`
	LastHeartbeatAt *time.Time      `json:"last_heartbeat,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	Mode            string          `json:"mode"`
	Schedulable     Schedulable     `json:"schedulable"`
	SlotSummary     SlotSummary     `json:"slot_summary"`

	// Simulated: the node's hostd reported the sim runtime (no VMs, no disk writes) at
	// enrollment or since; it stays set until the node is enrolled again with a new token.
	Simulated bool `json:"simulated"`
	// Waiting lists the node's queued tasks its hostd does not decode, with the release they
	// need ("2 slice.vm_provision schema 2 task(s): host needs gpuaas-hostd >= X (it runs Y)");
	// show only.
	Waiting []string `json:"waiting,omitempty"`
	// BootstrapToken is set only in the response that created the node: a one-time,
	// expiring token for `gpuaas-hostd enroll`.
	BootstrapToken          string    `json:"bootstrap_token,omitempty"`
	BootstrapTokenExpiresAt time.Time `json:"bootstrap_token_expires_at,omitzero"`
}

// Schedulable says whether new placements may land on the node, and why not.
type Schedulable struct {
	Baremetal bool     `json:"baremetal"`
	Slice     bool     `json:"slice"`
	Reasons   []string `json:"reasons,omitempty"`
	// SliceSupported is seed 003's capability rule: slice profile tag AND a verified firmware
	// profile AND approved slots. SliceMissing names the parts that are not there yet.
	SliceSupported bool     `json:"slice_supported"`
	SliceMissing   []string `json:"slice_missing,omitempty"`
}

// SlotSummary aggregates a node's slots.
type SlotSummary struct {
	Total    int            `json:"total"`
	ByStatus map[string]int `json:"by_status"`
	BySKU    []SKUSlots     `json:"by_sku"`
	// LiveClaims counts reserved/provisioning/active/releasing claims of each kind.
	LiveSlotClaims      int `json:"live_slot_claims"`
	LiveExclusiveClaims int `json:"live_exclusive_claims"`
}

// SKUSlots is schedulable slot capacity per slice SKU on one node.
type SKUSlots struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
}

// NodeCreate registers a node (admin).
type NodeCreate struct {
	Name         string   `json:"name"`
	Region       string   `json:"region"`
	TenantID     string   `json:"tenant_id,omitempty"`
	SKU          string   `json:"sku,omitempty"`
	SliceSKU     string   `json:"slice_sku,omitempty"`
	ProfileTags  []string `json:"profile_tags,omitempty"`
	HardwareTags []string `json:"hardware_tags,omitempty"`
}

// Slot is one approved schedulable bundle (node_resource_slots row).
type Slot struct {
	ID            string `json:"id"`
	NodeID        string `json:"node_id"`
	SlotIndex     int    `json:"slot_index"`
	CapacityShape string `json:"capacity_shape"`
	Status        string `json:"status"`
	StatusReason  string `json:"status_reason,omitempty"`
	// NeedsWipe: the slot has held a claim since its last verified wipe; the database refuses
	// to make it available until a verified, signed wipe proof is recorded.
	NeedsWipe bool `json:"needs_wipe,omitempty"`
	// Health: healthy, degraded (still sold) or quarantined (never placed until an operator
	// clears it after a passed validation), with the reason and since when (docs/health.md).
	Health           string          `json:"health"`
	HealthReason     string          `json:"health_reason,omitempty"`
	HealthSince      *time.Time      `json:"health_since,omitempty"`
	ParentSlotID     string          `json:"parent_slot_id,omitempty"`
	SharingModel     string          `json:"sharing_model"`
	ProfileName      string          `json:"profile_name,omitempty"`
	GPUModel         string          `json:"gpu_model,omitempty"`
	GPUCount         int             `json:"gpu_count"`
	PCIAddress       string          `json:"pci_address"`
	GPUUUID          string          `json:"gpu_uuid,omitempty"`
	MIGProfile       string          `json:"mig_profile,omitempty"`
	GPUMemoryMiB     int             `json:"gpu_memory_mib"`
	ComputeMilli     int             `json:"compute_milli"`
	MaxClaims        int             `json:"max_claims"`
	NVMeDevice       string          `json:"nvme_device"`
	NetworkFabric    string          `json:"network_fabric"`
	NetworkDevice    string          `json:"network_device,omitempty"`
	FabricPCIAddress string          `json:"fabric_pci_address,omitempty"`
	FabricDeviceID   string          `json:"fabric_device_id,omitempty"`
	FabricMetadata   json.RawMessage `json:"fabric_metadata"`
	NUMANode         *int            `json:"numa_node"`
	VCPUCount        *int            `json:"vcpu_count,omitempty"`
	MemoryMiB        *int            `json:"memory_mib,omitempty"`
	// HostCPUs is the slot's own host CPU set on its NUMA node (cpulist form, internal/cpuset),
	// disjoint from every other enabled slot's on the node; its VMs' vCPUs are pinned to it.
	HostCPUs         string          `json:"host_cpus,omitempty"`
	MACAddress       string          `json:"mac_address"`
	PrivateIP        string          `json:"private_ip"`
	CapacityMetadata json.RawMessage `json:"capacity_metadata"`
	HealthMetadata   json.RawMessage `json:"health_metadata"`
	AllocationID     string          `json:"allocation_id,omitempty"`
	UpdatedAt        time.Time       `json:"updated_at"`
	// StagedImage is the image the host wrote onto this idle slot's disk after its last wipe
	// proof (warm slots, docs/images.md); nil when none.
	StagedImage *SlotStagedImage `json:"staged_image,omitempty"`
}

// SlotSpec is one slot of a declarative slot map (a reviewed site topology profile).
type SlotSpec struct {
	SlotIndex        int            `json:"slot_index" yaml:"slot_index"`
	GPUModel         string         `json:"gpu_model,omitempty" yaml:"gpu_model,omitempty"`
	PCIAddress       string         `json:"pci_address" yaml:"pci_address"`
	GPUUUID          string         `json:"gpu_uuid,omitempty" yaml:"gpu_uuid,omitempty"`
	GPUMemoryMiB     int            `json:"gpu_memory_mib,omitempty" yaml:"gpu_memory_mib,omitempty"`
	NVMeDevice       string         `json:"nvme_device" yaml:"nvme_device"`
	NetworkFabric    string         `json:"network_fabric,omitempty" yaml:"network_fabric,omitempty"`
	NetworkDevice    string         `json:"network_device,omitempty" yaml:"network_device,omitempty"`
	FabricPCIAddress string         `json:"fabric_pci_address,omitempty" yaml:"fabric_pci_address,omitempty"`
	FabricDeviceID   string         `json:"fabric_device_id,omitempty" yaml:"fabric_device_id,omitempty"`
	NUMANode         *int           `json:"numa_node" yaml:"numa_node"`
	VCPUCount        *int           `json:"vcpu_count,omitempty" yaml:"vcpu_count,omitempty"`
	MemoryMiB        *int           `json:"memory_mib,omitempty" yaml:"memory_mib,omitempty"`
	HostCPUs         string         `json:"host_cpus,omitempty" yaml:"host_cpus,omitempty"`
	MACAddress       string         `json:"mac_address" yaml:"mac_address"`
	PrivateIP        string         `json:"private_ip" yaml:"private_ip"`
	CapacityMetadata map[string]any `json:"capacity_metadata" yaml:"capacity_metadata"`
	// Reserved for future fractional shapes; v1 scheduling ignores slots that set them.
	ParentSlotIndex *int   `json:"parent_slot_index,omitempty" yaml:"parent_slot_index,omitempty"`
	SharingModel    string `json:"sharing_model,omitempty" yaml:"sharing_model,omitempty"`
	ProfileName     string `json:"profile_name,omitempty" yaml:"profile_name,omitempty"`
	ComputeMilli    *int   `json:"compute_milli,omitempty" yaml:"compute_milli,omitempty"`
	MaxClaims       *int   `json:"max_claims,omitempty" yaml:"max_claims,omitempty"`
}

// SlotApply is the body of PUT /admin/nodes/{id}/slots.
type SlotApply struct {
	Slots  []SlotSpec `json:"slots"`
	DryRun bool       `json:"dry_run"`
	// HousekeepingCPUs, when set, replaces the node's housekeeping set (cpulist; "" keeps no
	// CPU back). Unset keeps the node's set, or, when slots without host_cpus are filled from
	// discovery and the node has none yet, takes the default (the first core of each NUMA node).
	HousekeepingCPUs *string `json:"housekeeping_cpus,omitempty"`
}

// SlotChange is one line of a slot-map diff.
type SlotChange struct {
	SlotIndex int      `json:"slot_index"`
	Action    string   `json:"action"` // create | update | disable | unchanged
	Fields    []string `json:"fields,omitempty"`
	// HostCPUs is the slot's host CPU set with the map applied (cpulist; "" none, or disabled).
	HostCPUs string `json:"host_cpus,omitempty"`
}

// SlotApplyResult reports the diff and whether it was applied.
type SlotApplyResult struct {
	Applied bool         `json:"applied"`
	Changes []SlotChange `json:"changes"`
	// HousekeepingCPUs is the node's housekeeping set with the map applied (cpulist).
	HousekeepingCPUs string `json:"housekeeping_cpus"`
}

// OSImage is an os_images catalog row.
type OSImage struct {
	ID                    string          `json:"id"`
	Slug                  string          `json:"slug"`
	DisplayName           string          `json:"display_name"`
	Version               string          `json:"version"`
	Target                string          `json:"target"`
	Family                string          `json:"family"`
	Architecture          string          `json:"architecture"`
	AcceleratorVendor     string          `json:"accelerator_vendor,omitempty"`
	NetworkFabric         string          `json:"network_fabric,omitempty"`
	ImageFormat           string          `json:"image_format"`
	SourceType            string          `json:"source_type"`
	SourceRef             string          `json:"source_ref"`
	DigestSHA256          string          `json:"digest_sha256,omitempty"`
	SizeBytes             *int64          `json:"size_bytes,omitempty"`
	CloudInitSupported    bool            `json:"cloud_init_supported"`
	GuestAgentSupported   bool            `json:"guest_agent_supported"`
	DefaultUsername       string          `json:"default_username"`
	DriverStrategy        string          `json:"driver_strategy"`
	CompatibilityMetadata json.RawMessage `json:"compatibility_metadata"`
	IsDefault             bool            `json:"is_default"`
	Active                bool            `json:"active"`
	CreatedAt             time.Time       `json:"created_at"`
	UpdatedAt             time.Time       `json:"updated_at"`
	RetiredAt             *time.Time      `json:"retired_at,omitempty"`
	// Signature is the publisher's detached ed25519 signature over the digest, standard
	// base64 (docs/images.md); a trusted key must verify it.
	Signature string `json:"signature,omitempty"`
}

// OSImagePatch updates mutable image fields.
type OSImagePatch struct {
	DisplayName           *string          `json:"display_name,omitempty"`
	SourceRef             *string          `json:"source_ref,omitempty"`
	DigestSHA256          *string          `json:"digest_sha256,omitempty"`
	SizeBytes             *int64           `json:"size_bytes,omitempty"`
	CompatibilityMetadata *json.RawMessage `json:"compatibility_metadata,omitempty"`
	IsDefault             *bool            `json:"is_default,omitempty"`
	Active                *bool            `json:"active,omitempty"`
	// Signature replaces the image's signature ("" removes it). A new digest without a new
	// signature drops the old one.
	Signature *string `json:"signature,omitempty"`
}

// AllocationCreate is the body of POST /allocations.
type AllocationCreate struct {
	SKU           string   `json:"sku"`
	GPUs          int      `json:"gpus"`
	Region        string   `json:"region,omitempty"`
	Image         string   `json:"image,omitempty"`   // os_images slug; default resolved from the SKU
	Profile       string   `json:"profile,omitempty"` // admin-only override of the slice VM profile
	SSHPublicKeys []string `json:"ssh_public_keys,omitempty"`
	TenantID      string   `json:"tenant_id,omitempty"` // admin creating for a tenant
	// ReservationID places the allocation inside the tenant's capacity reservation.
	ReservationID string `json:"reservation_id,omitempty"`
}

// ResolvedProfile is the VM shape snapshotted into an allocation at creation.
type ResolvedProfile struct {
	Name        string          `json:"name"`
	Source      string          `json:"source"` // sku_profile | scaled_from_default | admin_override | baremetal
	DerivedFrom string          `json:"derived_from,omitempty"`
	GPUCount    int             `json:"gpu_count"`
	VCPUCount   int             `json:"vcpu_count"`
	MemoryMiB   int             `json:"memory_mib"`
	Hugepages   json.RawMessage `json:"hugepages,omitempty"`
	// GuestDriverProfile is the guest driver install run at first boot (empty: none).
	GuestDriverProfile string `json:"guest_driver_profile,omitempty"`
}

// Price is the SKU price captured when the allocation was created.
type Price struct {
	GPUHourlyPriceMinor int64  `json:"gpu_hourly_price_minor"`
	Currency            string `json:"currency"`
	GPUs                int    `json:"gpus"`
	CapacityShape       string `json:"capacity_shape"`
}

// Cost is accrued usage: from active_at until released_at (or now).
type Cost struct {
	BilledSeconds int64  `json:"billed_seconds"`
	AccruedMinor  int64  `json:"accrued_minor"`
	Currency      string `json:"currency"`
}

// ImageRef is the image snapshot of an allocation.
type ImageRef struct {
	ID           string `json:"id"`
	Slug         string `json:"slug"`
	SourceRef    string `json:"source_ref"`
	DigestSHA256 string `json:"digest_sha256"`
}

// Claim is one allocation_resource_claims row with its device snapshot.
type Claim struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"`
	Status     string    `json:"status"`
	NodeID     string    `json:"node_id"`
	SlotID     string    `json:"slot_id,omitempty"`
	SlotIndex  *int      `json:"slot_index,omitempty"`
	NUMANode   *int      `json:"numa_node,omitempty"`
	PCIAddress string    `json:"pci_address,omitempty"`
	NVMeDevice string    `json:"nvme_device,omitempty"`
	FabricVF   string    `json:"fabric_vf_pci_address,omitempty"`
	MACAddress string    `json:"mac_address,omitempty"`
	PrivateIP  string    `json:"private_ip,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
}

// Allocation is a tenant's lease. Node and Claims are shown to admins only.
type Allocation struct {
	ID              string `json:"id"`
	TenantID        string `json:"tenant_id"`
	SKU             string `json:"sku"`
	CapacityShape   string `json:"capacity_shape"`
	GPUs            int    `json:"gpus"`
	Region          string `json:"region"`
	Status          string `json:"status"`
	PlacementStatus string `json:"placement_status"`
	NodeID          string `json:"node_id,omitempty"`
	NodeName        string `json:"node_name,omitempty"`
	// Node names the placement: the node's name for admins; for tenants a stable opaque id
	// ("host-" + 12 hex digits, per tenant and node), enough to see two allocations share a host.
	Node string `json:"node,omitempty"`
	// Slots are the slots the allocation holds (stable interface: slot_index, numa_node).
	Slots   []AllocationSlot `json:"slots"`
	Profile ResolvedProfile  `json:"profile"`
	Image   *ImageRef        `json:"image,omitempty"`
	Price   Price            `json:"price"`
	Cost    Cost             `json:"cost"`
	Claims  []Claim          `json:"claims,omitempty"`
	// Tasks are the host tasks run for this allocation, with their phase timings (show only).
	Tasks         []AllocationTask `json:"tasks,omitempty"`
	SSHPublicKeys []string         `json:"ssh_public_keys,omitempty"`
	FailureReason string           `json:"failure_reason,omitempty"`
	CreatedAt     time.Time        `json:"created_at"`
	ActiveAt      *time.Time       `json:"active_at,omitempty"`
	ReleasingAt   *time.Time       `json:"releasing_at,omitempty"`
	ReleasedAt    *time.Time       `json:"released_at,omitempty"`

	// Simulated: the allocation's node runs the sim runtime, so no VM exists and its disks
	// are never written (sold only by a controller that allows simulated hosts).
	Simulated bool `json:"simulated,omitempty"`
	// ReservationID is the capacity reservation the allocation was placed in, if any.
	ReservationID string `json:"reservation_id,omitempty"`
	// Handover says how the allocation's disks were erased after it ended, from the hosts'
	// signed, verified wipe proofs ("2 disks sanitized (crypto erase) and verified at ...");
	// it names no host or device. Show only, once released or failed.
	Handover string `json:"handover,omitempty"`
	// HealthEvents are the health events of the allocation's slots while it held them (show
	// only), oldest first: what the hosts saw, never which host or device.
	HealthEvents []HealthEvent `json:"health_events,omitempty"`
}

// AllocationSlot is one slot an allocation holds, as every caller may see it.
type AllocationSlot struct {
	SlotIndex  int    `json:"slot_index"`
	NUMANode   *int   `json:"numa_node"`
	Status     string `json:"status"`
	MACAddress string `json:"mac_address,omitempty"`
	PrivateIP  string `json:"private_ip,omitempty"`
}

// PlacementRequest is the body of POST /placement/explain (a dry run that reserves nothing).
type PlacementRequest struct {
	SKU    string `json:"sku"`
	GPUs   int    `json:"gpus"`
	Region string `json:"region,omitempty"`
	// TenantID: an admin asks as that tenant would be placed (its dedicated nodes count);
	// a tenant may only name itself.
	TenantID string `json:"tenant_id,omitempty"`
	// ReservationID explains a placement inside that capacity reservation (its tenant's).
	ReservationID string `json:"reservation_id,omitempty"`
}

// PlacementChoice is one ranked candidate.
type PlacementChoice struct {
	NodeID      string `json:"node_id,omitempty"`
	NodeName    string `json:"node_name,omitempty"`
	SlotIndexes []int  `json:"slot_indexes,omitempty"`
	NUMANodes   []int  `json:"numa_nodes,omitempty"`
	Reason      string `json:"reason"`
	// For a slice: how much the pick grows the node's expected unusable free GPUs now (the FGD
	// change) and the ranking's criterion, the look-ahead (docs/scheduling.md), both in GPUs;
	// lower is better. Tier is the choice's ranking class (1 the best): choices of one tier
	// differ only in tie-breakers. Absent for a whole node.
	FragmentationDelta *float64 `json:"fragmentation_delta,omitempty"`
	Lookahead          *float64 `json:"lookahead,omitempty"`
	Tier               int      `json:"tier,omitempty"`
}

// PlacementExplain answers a placement dry run.
type PlacementExplain struct {
	Feasible bool              `json:"feasible"`
	Reason   string            `json:"reason,omitempty"`
	Message  string            `json:"message"`
	Choices  []PlacementChoice `json:"choices,omitempty"`
	Details  map[string]any    `json:"details,omitempty"`
	// DemandMix is the mix the ranking's look-ahead protected (admins only).
	DemandMix *DemandMix `json:"demand_mix,omitempty"`
}

// DemandMix is the demand mix a slice SKU's placement protects, and where it came from
// (docs/scheduling.md, "Demand mix").
type DemandMix struct {
	// Source is learned (from the requests seen, decayed), pinned (an admin's) or default
	// (not enough history yet).
	Source  string           `json:"source"`
	Entries []DemandMixEntry `json:"entries"`
	// Requests is the decayed requests a learned mix comes from; for the default, the
	// history gathered so far.
	Requests float64 `json:"requests"`
	// MinRequests is the history a learned mix needs (shown with the default).
	MinRequests float64    `json:"min_requests,omitempty"`
	Scope       string     `json:"scope,omitempty"` // learned: region (the region's own) or sku (every region's)
	PinnedBy    string     `json:"pinned_by,omitempty"`
	PinnedAt    *time.Time `json:"pinned_at,omitempty"`
}

// DemandMixEntry is one request size of a demand mix: its weight, relative to the others',
// and its share.
type DemandMixEntry struct {
	GPUs   int     `json:"gpus"`
	Weight int     `json:"weight"`
	Share  float64 `json:"share,omitempty"`
}

// DemandMixPin pins a slice SKU's demand mix (admin); no entries unpins it.
type DemandMixPin struct {
	Entries []DemandMixEntry `json:"entries"`
}

// Capacity distinguishes raw free slots from topology-safe capacity (seed 001
// "Marketplace Capacity Accounting").
type Capacity struct {
	SKU           string `json:"sku"`
	Region        string `json:"region"`
	CapacityShape string `json:"capacity_shape"`
	// RawFreeSlots counts slots passing every filter; not additive with baremetal nodes.
	RawFreeSlots int `json:"raw_free_slots"`
	// Launchable[n] is how many n-GPU allocations could be placed at once right now.
	Launchable map[string]int `json:"launchable"`
	// BlockedByPolicy counts otherwise-free slots excluded by fabric/storage policy.
	BlockedByPolicy int `json:"blocked_by_policy"`
	FreeNodes       int `json:"free_nodes"` // baremetal: whole nodes free
	// DemandMix is the mix placement protects for this SKU and region (admins only).
	DemandMix *DemandMix `json:"demand_mix,omitempty"`
}

// Tenant is a customer account.
type Tenant struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// TokenCreate asks for a new API token (admin).
type TokenCreate struct {
	Name     string `json:"name"`
	Role     string `json:"role"` // admin | tenant
	TenantID string `json:"tenant_id,omitempty"`
	TTL      string `json:"ttl,omitempty"` // Go duration; empty = no expiry
}

// Token is returned once, at creation; only its hash is stored.
type Token struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	TenantID  string     `json:"tenant_id,omitempty"`
	Token     string     `json:"token,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Listings only (the secret is never listed).
	CreatedAt  *time.Time `json:"created_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
}

// NodeRevocation is what revoking a node's credentials did.
type NodeRevocation struct {
	NodeID                 string `json:"node_id"`
	RevokedCertificates    int    `json:"revoked_certificates"`
	RevokedBootstrapTokens int    `json:"revoked_bootstrap_tokens"`
}

// Whoami describes the caller.
type Whoami struct {
	TokenID  string `json:"token_id"`
	Name     string `json:"name"`
	Role     string `json:"role"`
	TenantID string `json:"tenant_id,omitempty"`
	// ServerVersion is the controller's build (authenticated callers only).
	ServerVersion string `json:"server_version,omitempty"`
}

// AuditEntry is one audit_log row.
type AuditEntry struct {
	ID         int64           `json:"id"`
	At         time.Time       `json:"at"`
	Actor      string          `json:"actor"`
	ActorRole  string          `json:"actor_role"`
	TenantID   string          `json:"tenant_id,omitempty"`
	Action     string          `json:"action"`
	TargetKind string          `json:"target_kind"`
	TargetID   string          `json:"target_id"`
	RequestID  string          `json:"request_id,omitempty"`
	Details    json.RawMessage `json:"details"`
}

// List wraps list responses so fields can be added without breaking clients.
type List[T any] struct {
	Items []T `json:"items"`
}

// BootstrapToken is a one-time node enrollment token (shown once).
type BootstrapToken struct {
	NodeID    string    `json:"node_id"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// EnrollRequest exchanges a bootstrap token (or, for renewal, the current certificate) and a
// public key for a node certificate.
type EnrollRequest struct {
	BootstrapToken string `json:"bootstrap_token,omitempty"`
	PublicKeyPEM   string `json:"public_key_pem"`

	// Runtime is the hostd runtime (libvirt, lab, sim): a node enrolled with sim is recorded
	// as simulated. Empty (an older hostd) counts as not simulated until a heartbeat says.
	Runtime string `json:"runtime,omitempty"`
	// LabHost: the host is the lab host VM, whose GPUs and fabric are emulated stand-ins;
	// it is recorded as simulated like a sim host.
	LabHost bool `json:"lab_host,omitempty"`
}

// Enrollment is the node's identity: its certificate, the CA, and the key that signs tasks.
type Enrollment struct {
	NodeID                  string    `json:"node_id"`
	CertificatePEM          string    `json:"certificate_pem"`
	CAPEM                   string    `json:"ca_pem"`
	TaskSigningPublicKeyPEM string    `json:"task_signing_public_key_pem"`
	NotAfter                time.Time `json:"not_after"`
}

// Heartbeat is what a host agent reports periodically.
type Heartbeat struct {
	AgentVersion    string          `json:"agent_version"`
	Runtime         string          `json:"runtime"`
	LabHost         bool            `json:"lab_host,omitempty"` // emulated stand-ins: simulated (EnrollRequest.LabHost)
	TaskTypes       []string        `json:"task_types"`
	Facts           json.RawMessage `json:"facts,omitempty"`
	FirmwareProfile json.RawMessage `json:"firmware_profile,omitempty"`
	Prerequisites   json.RawMessage `json:"prerequisites,omitempty"`
	RunningTasks    int             `json:"running_tasks"`
}

// TaskPhase is one timed step of a node task.
type TaskPhase struct {
	Name       string    `json:"name"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS int64     `json:"duration_ms"`
	Status     string    `json:"status"` // ok | simulated (the sim runtime: nothing was done) | failed | skipped | running (progress of the phase in flight)
	Error      string    `json:"error,omitempty"`
	Detail     string    `json:"detail,omitempty"` // what the phase did, or why it was skipped
}

// Note is the phase's error, else what it did or why it was skipped.
func (p TaskPhase) Note() string {
	if p.Error != "" {
		return p.Error
	}
	return p.Detail
}

// Task is a node task as the admin API shows it.
type Task struct {
	ID             string          `json:"id"`
	NodeID         string          `json:"node_id"`
	AllocationID   string          `json:"allocation_id,omitempty"`
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload"`
	Status         string          `json:"status"`
	Attempt        int             `json:"attempt"`
	MaxAttempts    int             `json:"max_attempts"`
	NotAfter       time.Time       `json:"not_after"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at,omitempty"`
	Output         json.RawMessage `json:"output,omitempty"`
	Phases         []TaskPhase     `json:"phases"`
	Error          string          `json:"error,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	CompletedAt    *time.Time      `json:"completed_at,omitempty"`
	// SchemaVersion is the payload's schema version for its type (1 for every type so far).
	SchemaVersion int `json:"schema_version"`
	// Waiting says why a queued task is not handed to its host: the host's gpuaas-hostd does
	// not decode its type or schema version ("host needs gpuaas-hostd >= X").
	Waiting string `json:"waiting,omitempty"`
}

// AllocationTask is a host task of an allocation as its tenant sees it.
type AllocationTask struct {
	ID        string      `json:"id"`
	Type      string      `json:"type"`
	Status    string      `json:"status"`
	Attempt   int         `json:"attempt"`
	Phases    []TaskPhase `json:"phases"`
	Error     string      `json:"error,omitempty"`
	CreatedAt time.Time   `json:"created_at"`
	// SchemaVersion is the payload's schema version; Waiting says why a queued task is not
	// handed to its host yet ("host needs gpuaas-hostd >= X"); it names no host.
	SchemaVersion int    `json:"schema_version,omitempty"`
	Waiting       string `json:"waiting,omitempty"`
}

// Discovery is the latest slice-topology discovery of a node: the task and, once it
// succeeded, its report (candidates stay advisory until approved).
type Discovery struct {
	NodeID      string          `json:"node_id"`
	TaskID      string          `json:"task_id"`
	Status      string          `json:"status"`
	Error       string          `json:"error,omitempty"`
	CompletedAt *time.Time      `json:"completed_at,omitempty"`
	Report      json.RawMessage `json:"report,omitempty"`
}

// Reconcile is a node's latest slice.reconcile task and, once it succeeded, the host's
// drift report (task.ReconcileReport: per-slot drift, orphan domains, leases, reservations).
type Reconcile struct {
	NodeID      string          `json:"node_id"`
	TaskID      string          `json:"task_id"`
	Status      string          `json:"status"`
	Error       string          `json:"error,omitempty"`
	CompletedAt *time.Time      `json:"completed_at,omitempty"`
	Report      json.RawMessage `json:"report,omitempty"`
}

// SlotApprove promotes discovered candidates into approved slots.
type SlotApprove struct {
	SlotIndexes []int `json:"slot_indexes,omitempty"`
	AllReady    bool  `json:"all_ready"`
	DryRun      bool  `json:"dry_run"`
	// HousekeepingCPUs is SlotApply's: unset keeps the node's set, or takes the default.
	HousekeepingCPUs *string `json:"housekeeping_cpus,omitempty"`
}

// StorageTransitionRequest asks a node's host to hand raw devices to slice ownership.
type StorageTransitionRequest struct {
	Devices []string `json:"devices"`
	Apply   bool     `json:"apply"`
	Confirm string   `json:"confirm,omitempty"` // the node name, required with apply
}

// TerminalRequest opens a session into an allocation's VM.
type TerminalRequest struct {
	Mode    string `json:"mode"`              // terminal | stdio | console (admin)
	Command string `json:"command,omitempty"` // terminal mode: run this instead of a login shell
	Cols    int    `json:"cols,omitempty"`    // terminal mode: > 0 requests a PTY of this size
	Rows    int    `json:"rows,omitempty"`
}

// TerminalTicket is the answer to a TerminalRequest: attach to AttachPath with Token within
// ExpiresAt. The token works once.
type TerminalTicket struct {
	SessionID  string    `json:"session_id"`
	Token      string    `json:"token"`
	AttachPath string    `json:"attach_path"`
	ExpiresAt  time.Time `json:"expires_at"`

	// Simulated: the slice is on a simulated host; a simulated guest answers, not a VM.
	Simulated bool `json:"simulated,omitempty"`
}

// TerminalSession is a recorded session (sessions list/show).
type TerminalSession struct {
	ID           string     `json:"id"`
	AllocationID string     `json:"allocation_id"`
	TenantID     string     `json:"tenant_id"`
	Actor        string     `json:"actor"`
	ActorRole    string     `json:"actor_role"`
	Mode         string     `json:"mode"`
	Command      string     `json:"command,omitempty"`
	Status       string     `json:"status"`
	CreatedAt    time.Time  `json:"created_at"`
	StartedAt    *time.Time `json:"started_at,omitempty"`
	EndedAt      *time.Time `json:"ended_at,omitempty"`
	BytesIn      int64      `json:"bytes_in"`
	BytesOut     int64      `json:"bytes_out"`
	ExitStatus   *int       `json:"exit_status,omitempty"`
	EndReason    string     `json:"end_reason,omitempty"`
	Recorded     bool       `json:"recorded"`
}

// ImageRollout is one rollout of a new default image for a SKU: a canary on a share of the
// SKU's nodes (or on named regions), then promoted or rolled back.
type ImageRollout struct {
	ID            string     `json:"id"`
	SKU           string     `json:"sku"`
	Image         string     `json:"image"`                    // slug of the new image
	PreviousImage string     `json:"previous_image,omitempty"` // slug of the default it replaces
	SharePercent  int        `json:"share_percent"`
	Regions       []string   `json:"regions,omitempty"`
	Status        string     `json:"status"` // canary, promoted, rolled_back
	StartedAt     time.Time  `json:"started_at"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
}

// ImageRolloutCreate starts a canary: Image becomes the default on SharePercent of the
// SKU's nodes and on every node of Regions.
type ImageRolloutCreate struct {
	Image        string   `json:"image"`
	SharePercent int      `json:"share_percent"`
	Regions      []string `json:"regions,omitempty"`
}

// DefaultImageSet points a SKU's default at an image directly (no canary): how a SKU gets
// its first default.
type DefaultImageSet struct {
	Image string `json:"image"`
}

// ImageOutcome is how the allocations of one image fared since a rollout started.
type ImageOutcome struct {
	Image       string `json:"image"`
	Allocations int    `json:"allocations"`
	Active      int    `json:"reached_active"`
	Failed      int    `json:"failed"` // failed before reaching active (readiness and other provisioning failures)
	// TimeToReadyP50MS and TimeToReadyMaxMS are from create to active, over those that got there.
	TimeToReadyP50MS int64 `json:"time_to_ready_p50_ms"`
	TimeToReadyMaxMS int64 `json:"time_to_ready_max_ms"`
}

// ImageRolloutStatus is a SKU's default image pointer, its canary in progress if any, how
// allocations on the canary and on the default fared since it started, and past rollouts.
type ImageRolloutStatus struct {
	SKU          string         `json:"sku"`
	DefaultImage string         `json:"default_image,omitempty"` // "" when the SKU has no pointer (newest compatible image)
	Canary       *ImageRollout  `json:"canary,omitempty"`
	Outcomes     []ImageOutcome `json:"outcomes"`
	History      []ImageRollout `json:"history"`
}

// ImageSmokeTestCreate asks for a smoke test of an image on a node.
type ImageSmokeTestCreate struct {
	Node string `json:"node"` // node id or name
}

// SlotStagedImage is an image staged on an idle slot's disk: which, when, and after which
// verified wipe proof (slot_wipe_proofs id).
type SlotStagedImage struct {
	ImageID      string    `json:"image_id"`
	DigestSHA256 string    `json:"digest_sha256"`
	StagedAt     time.Time `json:"staged_at"`
	AfterProof   int64     `json:"after_wipe_proof"`
}

// ImageSmokeTest is one smoke test of an image: a validation allocation of one slot on the
// chosen node, booted with the image through the normal provisioning path. Status is
// running until the allocation reaches active (passed) or fails (failed).
type ImageSmokeTest struct {
	ID               string    `json:"id"`
	Image            string    `json:"image"`
	DigestSHA256     string    `json:"digest_sha256"`
	Node             string    `json:"node"`
	AllocationID     string    `json:"allocation_id"`
	Status           string    `json:"status"` // running, passed, failed
	AllocationStatus string    `json:"allocation_status"`
	FailureReason    string    `json:"failure_reason,omitempty"`
	TimeToReadyMS    int64     `json:"time_to_ready_ms,omitempty"`
	Simulated        bool      `json:"simulated,omitempty"` // the node runs the sim runtime: nothing booted
	StartedAt        time.Time `json:"started_at"`
	// Current says the test was of the image's current digest (only such a pass counts).
	Current bool `json:"current"`
	// GPUCheck is what the guest's GPU check said after the boot: "ok: nvidia-smi lists N
	// GPUs: ...", "failed: ..." (a failed check fails the test), "none: no GPU here (lab
	// host ...)", or "not run (...)" when the probe was skipped; "" while none ran yet.
	GPUCheck string `json:"gpu_check,omitempty"`
}
