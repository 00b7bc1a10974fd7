package apiv1

import (
	"encoding/json"
	"time"
)

// CodeCursorExpired: events after the cursor were removed by the log's retention before they
// were read (410); details carry pruned_through. Read again without a cursor (or with since=).
const CodeCursorExpired = "cursor_expired"

// Event is one entry of the event log (GET /api/v1/events). Cursor is opaque: pass the
// page's NextCursor back as ?after= to resume with no gap and no duplicate.
type Event struct {
	Cursor       string          `json:"cursor"`
	Type         string          `json:"type"`
	AllocationID string          `json:"allocation_id,omitempty"`
	TenantID     string          `json:"tenant_id,omitempty"` // operators only
	NodeID       string          `json:"node_id,omitempty"`   // operators only
	Data         json.RawMessage `json:"data"`
	CreatedAt    time.Time       `json:"created_at"`
}

// EventPage is one answer of GET /api/v1/events.
type EventPage struct {
	Events     []Event `json:"events"`
	NextCursor string  `json:"next_cursor"`
}

// MaintenanceRequest schedules maintenance of a node with the drain (POST
// /api/v1/admin/nodes/{id}/drain): Notice is how long from now until the deadline (Go
// duration, e.g. "24h"), Reason what tenants are told.
type MaintenanceRequest struct {
	Notice string `json:"notice,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// MaintenanceNotice is a scheduled maintenance. Tenants see the allocations of theirs it
// affects, never the node; operators see the node.
type MaintenanceNotice struct {
	ID          string    `json:"id"`
	NodeID      string    `json:"node_id,omitempty"`
	NodeName    string    `json:"node_name,omitempty"`
	Reason      string    `json:"reason"`
	Deadline    time.Time `json:"deadline"`
	CreatedAt   time.Time `json:"created_at"`
	Allocations []string  `json:"allocations"`
}

// WebhookCreate registers a webhook endpoint (POST /api/v1/webhooks). Admins name the tenant.
type WebhookCreate struct {
	URL      string `json:"url"`
	TenantID string `json:"tenant_id,omitempty"`
}

// Webhook is a registered endpoint. Secret (the HMAC-SHA256 key of its signatures) is shown
// once, when it is created.
type Webhook struct {
	ID        string    `json:"id"`
	TenantID  string    `json:"tenant_id"`
	URL       string    `json:"url"`
	Secret    string    `json:"secret,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Pending   int       `json:"pending"`
	Delivered int       `json:"delivered"`
	Dead      int       `json:"dead"`
}

// WebhookDelivery is one event's delivery to a webhook, with each attempt.
type WebhookDelivery struct {
	ID            string                   `json:"id"`
	EventCursor   string                   `json:"event_cursor"`
	EventType     string                   `json:"event_type"`
	Status        string                   `json:"status"` // pending | delivered | dead
	Attempts      int                      `json:"attempts"`
	NextAttemptAt *time.Time               `json:"next_attempt_at,omitempty"`
	LastError     string                   `json:"last_error,omitempty"`
	CreatedAt     time.Time                `json:"created_at"`
	FinishedAt    *time.Time               `json:"finished_at,omitempty"`
	History       []WebhookDeliveryAttempt `json:"history,omitempty"`
}

// WebhookDeliveryAttempt is one HTTPS POST of a delivery.
type WebhookDeliveryAttempt struct {
	Attempt    int       `json:"attempt"`
	At         time.Time `json:"at"`
	StatusCode int       `json:"status_code,omitempty"`
	Error      string    `json:"error,omitempty"`
	DurationMS int64     `json:"duration_ms"`
}
