package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/store"
)

const maxBodyBytes = 1 << 20

func apiErr(code, msg string, details map[string]any) *apiv1.Error {
	return &apiv1.Error{Code: code, Message: msg, Details: details}
}

func errInvalid(format string, args ...any) *apiv1.Error {
	return apiErr(apiv1.CodeInvalidRequest, fmt.Sprintf(format, args...), nil)
}
func errNotFound(msg string) *apiv1.Error  { return apiErr(apiv1.CodeNotFound, msg, nil) }
func errForbidden(msg string) *apiv1.Error { return apiErr(apiv1.CodeForbidden, msg, nil) }

func statusFor(code string) int {
	switch code {
	case apiv1.CodeInvalidRequest:
		return http.StatusBadRequest
	case apiv1.CodeUnauthorized:
		return http.StatusUnauthorized
	case apiv1.CodeForbidden:
		return http.StatusForbidden
	case apiv1.CodeNotFound:
		return http.StatusNotFound
	case apiv1.CodeConflict, apiv1.CodeIdempotencyReused:
		return http.StatusConflict
	case apiv1.CodeSKUUnavailable, apiv1.CodeQuotaExceeded:
		return http.StatusConflict
	case apiv1.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case apiv1.CodeCursorExpired:
		return http.StatusGone
	case apiv1.CodeRateLimited:
		return http.StatusTooManyRequests
	case apiv1.CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// toAPIError maps any error to the wire form. Internal details never leak to clients.
func toAPIError(err error) *apiv1.Error {
	var ae *apiv1.Error
	if errors.As(err, &ae) {
		return ae
	}
	var dbe *store.DBError
	var expired *store.CursorExpiredError
	switch {
	case errors.As(err, &expired):
		return apiErr(apiv1.CodeCursorExpired, expired.Error(), map[string]any{"pruned_through": expired.PrunedThrough.String()})
	case errors.Is(err, store.ErrNotFound):
		return errNotFound("not found")
	case errors.Is(err, store.ErrSimulated):
		// The database refused a simulated host (a node that turned sim after placement read
		// it); which node is not the tenant's business.
		return apiErr(apiv1.CodeSKUUnavailable, "no real capacity: the free capacity is on simulated hosts, which this controller does not sell",
			map[string]any{"reason": apiv1.ReasonSimulatedHosts})
	// The store put the database's refusal in our words (store.inOurWords); the constraint
	// name stays here, in the log at most.
	case errors.As(err, &dbe) && errors.Is(err, store.ErrConflict):
		return apiErr(apiv1.CodeConflict, dbe.Detail, nil)
	case errors.As(err, &dbe) && errors.Is(err, store.ErrInvalid):
		return apiErr(apiv1.CodeInvalidRequest, dbe.Detail, nil)
	case errors.Is(err, store.ErrConflict):
		return apiErr(apiv1.CodeConflict, err.Error(), nil)
	case errors.Is(err, store.ErrInvalid):
		return apiErr(apiv1.CodeInvalidRequest, err.Error(), nil)
	case store.Unavailable(err):
		// However a lost or refused database connection reached here (wrapped by a layer
		// that did not translate it), nothing was applied, or an idempotent retry settles it.
		return apiErr(apiv1.CodeUnavailable, "database unavailable; retry", map[string]any{"retryable": true})
	}
	return apiErr(apiv1.CodeInternal, "internal error", nil)
}

// statusClientClosed is what a request whose client went away before its answer ends with
// (the status proxies log for it): nobody reads the answer, and it is no server fault.
const statusClientClosed = 499

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		// The client closed its connection (or the replica is shutting down) while the
		// request ran: not an internal error, and not worth an operator's attention.
		w.WriteHeader(statusClientClosed)
		return
	}
	ae := toAPIError(err)
	if ae.Code == apiv1.CodeInternal {
		s.log.Error("internal error", "path", r.URL.Path, "request_id", requestID(r.Context()), "err", err)
	}
	switch ae.Code {
	case apiv1.CodeUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas"`)
	case apiv1.CodeRateLimited:
		if v, ok := ae.Details["retry_after_seconds"].(int); ok {
			w.Header().Set("Retry-After", strconv.Itoa(v))
		}
	}
	if ae.Code == apiv1.CodeUnavailable {
		// Nothing was applied (the transaction did not commit): clients retry, here or on
		// another replica, after a moment (a PostgreSQL restart or failover takes seconds).
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, statusFor(ae.Code), ae)
}

// writeJSON answers with v as compact JSON (clients format it for people: gpuaasctl
// indents its -o json output) in one write with its length declared, so the whole answer
// goes out in the fewest frames (indenting and a chunked body cost 5% of the controller's
// CPU per create+release pair).
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only an unencodable value (a programming error) gets here; say so, not half a body.
		status = http.StatusInternalServerError
		b, _ = json.Marshal(apiv1.Error{Code: apiv1.CodeInternal, Message: "response could not be encoded"})
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// decode reads exactly one JSON value, size-limited, valid UTF-8 (the JSON decoder would
// silently replace bad bytes), rejecting unknown fields by name.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return errInvalid("Content-Type must be application/json")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return apiErr(apiv1.CodeTooLarge, fmt.Sprintf("request body exceeds %d bytes", maxBodyBytes), nil)
		}
		return errInvalid("reading the request body: %v", err)
	}
	return decodeBody(body, v)
}

// decodeBody is decode after the body is read: the part the fuzzer drives.
func decodeBody(body []byte, v any) error {
	if !utf8.Valid(body) {
		return errInvalid("request body is not valid UTF-8")
	}
	if err := checkJSONText(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errInvalid("request body is empty")
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			name, _ := strconv.Unquote(f)
			return apiErr(apiv1.CodeInvalidRequest, "unknown field "+f, map[string]any{"field": name})
		}
		return errInvalid("invalid JSON body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errInvalid("request body must hold a single JSON object")
	}
	return nil
}
