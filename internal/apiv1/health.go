package apiv1

import (
	"encoding/json"
	"time"
)

// Slot health states (docs/health.md).
const (
	HealthHealthy     = "healthy"
	HealthDegraded    = "degraded"
	HealthQuarantined = "quarantined"
)

// HealthEvent is one entry of a slot's health history. On an allocation (tenants' view) it
// carries no node, evidence or actor: the slot's index in the allocation, what happened and
// what it did.
type HealthEvent struct {
	ID           int64           `json:"id"`
	At           time.Time       `json:"at"`
	NodeName     string          `json:"node_name,omitempty"`
	SlotIndex    *int            `json:"slot_index,omitempty"`
	AllocationID string          `json:"allocation_id,omitempty"`
	Source       string          `json:"source"`
	Signal       string          `json:"signal"`
	Action       string          `json:"action"`
	HealthBefore string          `json:"health_before,omitempty"`
	HealthAfter  string          `json:"health_after,omitempty"`
	Reason       string          `json:"reason"`
	Evidence     json.RawMessage `json:"evidence,omitempty"`
	Actor        string          `json:"actor,omitempty"`
}

// SlotValidation is one validation run on a slot: each check with its outcome.
type SlotValidation struct {
	ID           int64             `json:"id"`
	AllocationID string            `json:"allocation_id,omitempty"`
	TaskID       string            `json:"task_id,omitempty"`
	Level        string            `json:"level"`
	Passed       bool              `json:"passed"`
	Simulated    bool              `json:"simulated,omitempty"`
	Checks       []ValidationCheck `json:"checks"`
	Summary      string            `json:"summary,omitempty"`
	RecordedAt   time.Time         `json:"recorded_at"`
}

// ValidationCheck is one check of a validation run. Simulated: no real device was read (the
// sim runtime), and the check says so instead of "ok".
type ValidationCheck struct {
	Name      string `json:"name"`
	Passed    bool   `json:"passed"`
	Simulated bool   `json:"simulated,omitempty"`
	// Skipped: the step did not run (a tool the guest does not have); it fails nothing.
	Skipped bool   `json:"skipped,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// SlotHealth is GET .../slots/{index}/health: the slot's health with its recent history and
// validations, newest first.
type SlotHealth struct {
	NodeName     string           `json:"node_name"`
	SlotIndex    int              `json:"slot_index"`
	Health       string           `json:"health"`
	HealthReason string           `json:"health_reason,omitempty"`
	HealthSince  *time.Time       `json:"health_since,omitempty"`
	Events       []HealthEvent    `json:"events"`
	Validations  []SlotValidation `json:"validations"`
}

// SlotHealthChange is the body of POST .../slots/{index}/quarantine and .../clear.
type SlotHealthChange struct {
	Reason string `json:"reason"`
}

// NodeHealth is one node of GET /admin/health, the fleet summary (worst first).
type NodeHealth struct {
	Node        string     `json:"node"`
	Status      string     `json:"status"`
	Draining    bool       `json:"draining"`
	DrainReason string     `json:"drain_reason,omitempty"`
	Slots       int        `json:"slots"`
	Healthy     int        `json:"healthy"`
	Degraded    int        `json:"degraded"`
	Quarantined int        `json:"quarantined"`
	LastEventAt *time.Time `json:"last_event_at,omitempty"`
	LastEvent   string     `json:"last_event,omitempty"`
}

// ReleaseRequest is the optional body of POST /allocations/{id}/release. Report: the tenant
// says something was wrong; the allocation's slots are quarantined for operator review.
type ReleaseRequest struct {
	Report string `json:"report,omitempty"`
}

// HealthSignal is one health reading a host sends about one of its slots (POST
// /agent/health): the source that read it, the policy table's signal key, and what was seen.
// A reading about a device no slot holds is refused (and listed as refused).
type HealthSignal struct {
	// The slot, named by index, or by a device of it: its GPU's or fabric VF's PCI address.
	SlotIndex  *int   `json:"slot_index,omitempty"`
	PCIAddress string `json:"pci_address,omitempty"`
	// A guest's reading: the allocation's GPU by position (its live slots on this node, by
	// slot index); source must be "guest".
	AllocationID string `json:"allocation_id,omitempty"`
	GPUIndex     *int   `json:"gpu_index,omitempty"`
	// An NVMe reading: the /dev/disk/by-id names of its namespace (a slot's nvme_device is one).
	NVMeDevices []string       `json:"nvme_devices,omitempty"`
	Source      string         `json:"source"` // pcie, nvme, nvidia-smi, kernel, guest
	Signal      string         `json:"signal"` // "xid:79", "pcie:link_downtrained", ...
	Detail      string         `json:"detail,omitempty"`
	Evidence    map[string]any `json:"evidence,omitempty"`
}

// HealthReport is the body of POST /agent/health.
type HealthReport struct {
	Signals []HealthSignal `json:"signals"`
}

// HealthReportResult says what the controller recorded of a report and what it refused.
type HealthReportResult struct {
	Recorded int      `json:"recorded"`
	Refused  []string `json:"refused,omitempty"`
}

// HealthRule is one row of the policy table (GET /admin/health/policy).
type HealthRule struct {
	Signal string `json:"signal"`
	Name   string `json:"name"`
	Action string `json:"action"`
	Source string `json:"source"`
}
