package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// A lost database connection is a retryable 503 however it was wrapped on its way up, and
// an error that is not one stays an internal error (whose text never reaches the client).
func TestLostDatabaseConnectionIsUnavailable(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("read claims: %w", io.ErrUnexpectedEOF),
		fmt.Errorf("dispatch: %w", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}),
		fmt.Errorf("lease: %w", &pgconn.PgError{Code: "53300", Message: "sorry, too many clients already"}),
	} {
		if got := toAPIError(err); got.Code != apiv1.CodeUnavailable || statusFor(got.Code) != 503 {
			t.Errorf("toAPIError(%v) = %s %q, want unavailable", err, got.Code, got.Message)
		}
	}
	got := toAPIError(errors.New("a bug: SELECT secret FROM t"))
	if got.Code != apiv1.CodeInternal || got.Message != "internal error" {
		t.Errorf("an unknown error answered %s %q, want internal error without its text", got.Code, got.Message)
	}
}

// A request whose client went away while it ran ends as 499, logged as no server fault; the
// same error while the client still waits is an internal error, logged as one.
func TestClientGoneIsNoInternalError(t *testing.T) {
	var logged bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&logged, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	s.writeError(rec, httptest.NewRequest("GET", "/api/v1/allocations", nil).WithContext(ctx), fmt.Errorf("list: %w", context.Canceled))
	if rec.Code != statusClientClosed || strings.Contains(logged.String(), "internal error") {
		t.Fatalf("client gone: answered %d, logged %q; want 499 and no internal error", rec.Code, logged.String())
	}
	rec = httptest.NewRecorder()
	s.writeError(rec, httptest.NewRequest("GET", "/api/v1/allocations", nil), context.Canceled)
	if rec.Code != 500 || !strings.Contains(logged.String(), "internal error") {
		t.Fatalf("client waiting: answered %d, logged %q; want 500 and an internal error", rec.Code, logged.String())
	}
}
