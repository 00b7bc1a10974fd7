package store

import (
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// constraintWords says, for the constraints a client's request can run into, what went wrong
// in the client's terms: constraint, table and column names never leave the server.
var constraintWords = map[string]string{
	"tenants_name_key":                           "tenant name already taken",
	"nodes_name_key":                             "node name already taken",
	"sku_catalog_pkey":                           "a SKU of that name already exists",
	"os_images_slug_key":                         "an image with that slug already exists",
	"api_tokens_tenant_id_fkey":                  "tenant not found",
	"nodes_tenant_id_fkey":                       "tenant not found",
	"allocations_tenant_id_fkey":                 "tenant not found",
	"nodes_sku_fkey":                             "SKU not found",
	"nodes_slice_sku_fkey":                       "slice SKU not found",
	"allocations_sku_fkey":                       "SKU not found",
	"allocations_os_image_id_fkey":               "image not found",
	"node_resource_slots_node_id_slot_index_key": "that slot index already exists on the node",
	"sku_catalog_validation_policy_valid":        "validation_policy must be none, quick or burn-in",
	"slot_health_events_signal_check":            "a health signal is lower-case letters, digits and . _ : -",
	"tenant_quotas_tenant_id_fkey":               "tenant not found",
	"tenant_quotas_sku_fkey":                     "SKU not found",
	"capacity_reservations_tenant_id_fkey":       "tenant not found",
	"capacity_reservations_sku_fkey":             "SKU not found",
	"allocations_reservation_id_fkey":            "reservation not found",
	"os_images_signature_form":                   "signature is not 64 bytes of standard base64",
	"image_rollouts_one_canary":                  "a canary rollout of that SKU is already in progress: promote or roll it back first",
	"image_rollouts_new_image":                   "that image is already the SKU's default",
	"image_rollouts_sku_fkey":                    "SKU not found",
	"sku_image_pointers_sku_fkey":                "SKU not found",
	"image_rollouts_image_id_fkey":               "the image is named by a rollout; retire it instead",
	"image_rollouts_previous_image_id_fkey":      "the image is named by a rollout; retire it instead",
	"sku_image_pointers_image_id_fkey":           "the image is a SKU's default; retire it instead",
	"image_smoke_tests_image_id_fkey":            "the image has smoke tests; retire it instead",
}

// inOurWords is the message a database error may carry to a client. Our own triggers and
// functions raise messages written for clients (they name the slot, node or rule), so those
// pass; PostgreSQL's own messages name constraints, tables and types, so they are replaced by
// the constraint's words or, for one not listed, by what kind of mistake it was.
func inOurWords(e *pgconn.PgError) string {
	if strings.Contains(e.Where, "PL/pgSQL") {
		return e.Message
	}
	if w, ok := constraintWords[e.ConstraintName]; ok {
		return w
	}
	switch e.Code {
	case "23505", "23P01":
		return "that already exists"
	case "23503":
		return "it refers to something that does not exist"
	case "23514":
		return "a value is outside what is allowed"
	case "23502":
		return "a required value is missing"
	case "22P02":
		if strings.Contains(e.Message, "uuid") {
			return "not a valid id"
		}
		return "a value is not of the expected form"
	case "22007", "22008":
		return "not a valid date or time"
	case "22003":
		return "a number is out of range"
	case "22023":
		return "a value is not valid"
	}
	return "the database refused the change"
}
