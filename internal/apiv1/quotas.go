package apiv1

import "time"

// CodeQuotaExceeded: the request would take a tenant over a quota (409). Details carry the
// quota that refused it: limit ("gpus" or "allocations"), sku, region ("" = every region),
// max, used and requested.
const CodeQuotaExceeded = "quota_exceeded"

// ReasonReservationFull: a create inside a capacity reservation found no room in it (a
// sku_unavailable reason).
const ReasonReservationFull = "reservation_full"

// Quota is one tenant's limit for one SKU in one region ("" = every region together), with
// what counts against it now. A nil limit is no limit.
type Quota struct {
	TenantID       string    `json:"tenant_id"`
	Tenant         string    `json:"tenant,omitempty"`
	SKU            string    `json:"sku"`
	Region         string    `json:"region"`
	MaxGPUs        *int      `json:"max_gpus"`
	MaxAllocations *int      `json:"max_allocations"`
	UsedGPUs       int       `json:"used_gpus"`
	UsedAllocs     int       `json:"used_allocations"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// QuotaSet is an admin's PUT of a quota (the tenant is in the path). A nil limit is no limit.
type QuotaSet struct {
	SKU            string `json:"sku"`
	Region         string `json:"region,omitempty"`
	MaxGPUs        *int   `json:"max_gpus"`
	MaxAllocations *int   `json:"max_allocations"`
}

// Reservation states.
const (
	ReservationActive    = "active"
	ReservationCancelled = "cancelled"
	ReservationExpired   = "expired"
)

// Reservation is capacity held for a tenant: GPUs of a SKU on one host that only allocations
// created inside it (AllocationCreate.ReservationID) can take.
type Reservation struct {
	ID       string `json:"id"`
	TenantID string `json:"tenant_id"`
	SKU      string `json:"sku"`
	Region   string `json:"region"`
	GPUs     int    `json:"gpus"`
	Status   string `json:"status"`
	// Node is as in Allocation: the node's name for admins, an opaque per-tenant id for tenants.
	Node string `json:"node"`
	// InUse is the held GPUs that allocations inside the reservation hold now; Free the rest
	// that are available to them (a released slot returns once wiped).
	InUse int   `json:"in_use"`
	Free  int   `json:"free"`
	Price Price `json:"price"`
	// PricePolicy says how held capacity is billed.
	PricePolicy string     `json:"price_policy"`
	CreatedAt   time.Time  `json:"created_at"`
	EndsAt      *time.Time `json:"ends_at,omitempty"` // nil: until cancelled
	EndedAt     *time.Time `json:"ended_at,omitempty"`
}

// ReservationCreate asks to hold GPUs of a SKU, from now for DurationSeconds (0: until
// cancelled). TenantID is for admins reserving for a tenant.
type ReservationCreate struct {
	SKU             string `json:"sku"`
	GPUs            int    `json:"gpus"`
	Region          string `json:"region,omitempty"`
	DurationSeconds int64  `json:"duration_seconds,omitempty"`
	TenantID        string `json:"tenant_id,omitempty"`
}
