package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// ErrUnreachable matches (errors.Is) every transport failure: connection refused, DNS, TLS
// handshake or certificate verification, timeouts, a connection cut mid-response.
var ErrUnreachable = errors.New("cannot reach controller")

// ErrInvalidServer matches errors about the configured server address (missing, not https).
var ErrInvalidServer = errors.New("invalid controller address")

// NetworkError is a transport failure talking to URL. It matches ErrUnreachable and unwraps
// to the cause (e.g. *tls.CertificateVerificationError, *net.OpError).
type NetworkError struct {
	URL string
	Err error
}

func (e *NetworkError) Error() string {
	return fmt.Sprintf("cannot reach controller at %s: %v", e.URL, e.Err)
}

// Unwrap returns the transport error.
func (e *NetworkError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUnreachable) true.
func (e *NetworkError) Is(target error) bool { return target == ErrUnreachable }

// decodeError turns a non-2xx answer into *apiv1.Error: the controller's JSON body when it
// is one, else an Error whose code follows the HTTP status (a proxy's HTML page, say).
func decodeError(resp *http.Response, data []byte) *apiv1.Error {
	var ae apiv1.Error
	if err := json.Unmarshal(data, &ae); err == nil && ae.Code != "" {
		return &ae
	}
	msg := "HTTP " + resp.Status
	if s := strings.TrimSpace(string(data)); s != "" {
		if len(s) > 200 {
			s = s[:200] + "…"
		}
		msg += ": " + s
	}
	return &apiv1.Error{Code: CodeForStatus(resp.StatusCode), Message: msg, Details: map[string]any{"http_status": resp.StatusCode}}
}

// CodeForStatus is the apiv1 error code the controller uses for an HTTP status.
func CodeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusMethodNotAllowed:
		return apiv1.CodeInvalidRequest
	case http.StatusUnauthorized:
		return apiv1.CodeUnauthorized
	case http.StatusForbidden:
		return apiv1.CodeForbidden
	case http.StatusNotFound:
		return apiv1.CodeNotFound
	case http.StatusConflict:
		return apiv1.CodeConflict
	case http.StatusRequestEntityTooLarge:
		return apiv1.CodeTooLarge
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return apiv1.CodeUnavailable
	}
	return apiv1.CodeInternal
}
