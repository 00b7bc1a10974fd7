package api

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// checkRequestText refuses a request whose path or query is not valid UTF-8 or holds control
// characters: such values cannot name anything (PostgreSQL text refuses NUL and invalid
// UTF-8), and they would reach logs and audit details verbatim.
func checkRequestText(r *http.Request) error {
	if !plainText(r.URL.Path) {
		return errInvalid("the request path is not valid UTF-8 or holds control characters")
	}
	for k, vs := range r.URL.Query() {
		if !plainText(k) {
			return errInvalid("a query parameter name is not valid UTF-8 or holds control characters")
		}
		for _, v := range vs {
			if !plainText(v) {
				return errInvalid("query parameter %s is not valid UTF-8 or holds control characters", k)
			}
		}
	}
	return nil
}

func plainText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// queryParams are the query parameters each route reads (by "METHOD /pattern"); any other is
// refused, so a misspelt filter (?target=x for ?target_id=x) is an error rather than a
// silently unfiltered answer. A route not listed takes none.
var queryParams = map[string][]string{
	"GET /api/v1/capacity":                     {"sku", "region"},
	"GET /api/v1/admin/skus/{sku}/demand-mix":  {"region"},
	"GET /api/v1/allocations":                  {"status"},
	"GET /api/v1/admin/os-images":              {"target", "active", "family", "accelerator_vendor", "network_fabric"},
	"DELETE /api/v1/admin/os-images/{id}":      {"hard"},
	"GET /api/v1/admin/audit":                  {"limit", "action", "target_id"},
	"GET /api/v1/tasks":                        {"node", "allocation"},
	"GET /api/v1/agent/tasks":                  {"wait", "max"},
	"GET /api/v1/sessions":                     {"allocation"},
	"GET /api/v1/quotas":                       {"tenant"},
	"GET /api/v1/reservations":                 {"active", "tenant"},
	"DELETE /api/v1/admin/tenants/{id}/quotas": {"sku", "region"},
	"GET /api/v1/events":                       eventQuery,
	"GET /api/v1/webhooks/{id}/deliveries":     {"status", "limit"},
}

// checkQueryNames refuses a query parameter the route does not read, naming the ones it does.
func checkQueryNames(r *http.Request, route string) error {
	known := queryParams[route]
	for k := range r.URL.Query() {
		if slices.Contains(known, k) {
			continue
		}
		if len(known) == 0 {
			return apiErr(apiv1.CodeInvalidRequest, fmt.Sprintf("unknown query parameter %q: this endpoint takes none", k), map[string]any{"parameter": k})
		}
		return apiErr(apiv1.CodeInvalidRequest, fmt.Sprintf("unknown query parameter %q: this endpoint takes %s", k, strings.Join(known, ", ")),
			map[string]any{"parameter": k, "known": known})
	}
	return nil
}

// queryInt reads an optional integer query parameter within [min, max].
func queryInt(r *http.Request, name string, min, max int) (n int, present bool, err error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, false, nil
	}
	n, perr := strconv.Atoi(v)
	if perr != nil || n < min || n > max {
		return 0, true, errInvalid("%s must be an integer %d..%d", name, min, max)
	}
	return n, true, nil
}

// queryBool reads an optional true/false query parameter.
func queryBool(r *http.Request, name string) (b, present bool, err error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, false, nil
	}
	b, perr := strconv.ParseBool(v)
	if perr != nil {
		return false, true, errInvalid("%s must be true or false", name)
	}
	return b, true, nil
}

// queryDuration reads an optional duration query parameter (Go syntax, e.g. 30s) within
// [0, max]; def when absent.
func queryDuration(r *http.Request, name string, def, max time.Duration) (time.Duration, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > max {
		return 0, errInvalid("%s must be a duration up to %s", name, max)
	}
	return d, nil
}

// maxSlotIndex bounds slot indexes (slot maps hold at most 1024 indexes).
const maxSlotIndex = 1023

// pathSlotIndex reads the {index} path value: a slot index 0..maxSlotIndex.
func pathSlotIndex(r *http.Request) (int, error) {
	v := r.PathValue("index")
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxSlotIndex || strconv.Itoa(n) != v {
		return 0, errInvalid("slot index must be an integer 0..%d", maxSlotIndex)
	}
	return n, nil
}
