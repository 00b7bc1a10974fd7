package cmdutil

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
)

// Exit codes. The root command's help documents them; ExitCode is the only mapping.
const (
	ExitOK             = 0
	ExitError          = 1
	ExitUsage          = 2 // bad flags or arguments, invalid_request, payload_too_large
	ExitAuth           = 3 // unauthorized, forbidden, no token
	ExitNotFound       = 4
	ExitConflict       = 5 // conflict, idempotency_key_reused, cursor_expired
	ExitSKUUnavailable = 6 // sku_unavailable, quota_exceeded: nothing can be placed for this request now
	ExitUnavailable    = 7 // controller unreachable, unavailable or rate_limited (retryable)
)

// FlagError is a usage mistake (bad flag or argument): the only error that prints usage.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

// FlagErrorf builds a FlagError.
func FlagErrorf(format string, args ...any) error {
	return &FlagError{Err: fmt.Errorf(format, args...)}
}

// InputError is exit 2 like a usage mistake, without the usage text: the content of an input
// file (-f) is wrong, or a destructive command off a terminal lacks --yes (the command line's
// shape was right; printing every flag would bury the one line that matters).
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// InputErrorf builds an InputError.
func InputErrorf(format string, args ...any) error {
	return &InputError{Err: fmt.Errorf(format, args...)}
}

// StateError is an answer that ends a wait with the exit code of the state reached (e.g. an
// allocation released while waiting for it to become active: ExitConflict).
type StateError struct {
	Err  error
	Code int
}

func (e *StateError) Error() string { return e.Err.Error() }
func (e *StateError) Unwrap() error { return e.Err }

// AuthError is a missing credential, detected before any request.
type AuthError struct{ Err error }

func (e *AuthError) Error() string { return e.Err.Error() }
func (e *AuthError) Unwrap() error { return e.Err }

// SilentError ends the command with Code; the command has already said why.
type SilentError struct{ Code int }

func (e *SilentError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// ExitCode maps an error to gpuaasctl's exit code. It is the one place that does.
func ExitCode(err error) int {
	var (
		se  *SilentError
		fe  *FlagError
		ie  *InputError
		st  *StateError
		ae  *AuthError
		api *apiv1.Error
	)
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &se):
		return se.Code
	case errors.As(err, &st):
		return st.Code
	case errors.As(err, &fe), errors.As(err, &ie):
		return ExitUsage
	case errors.As(err, &ae):
		return ExitAuth
	case errors.Is(err, client.ErrUnreachable):
		return ExitUnavailable
	case errors.Is(err, context.Canceled):
		return ExitError
	case errors.As(err, &api):
		switch api.Code {
		case apiv1.CodeInvalidRequest, apiv1.CodeTooLarge:
			return ExitUsage
		case apiv1.CodeUnauthorized, apiv1.CodeForbidden:
			return ExitAuth
		case apiv1.CodeNotFound:
			return ExitNotFound
		case apiv1.CodeConflict, apiv1.CodeIdempotencyReused, apiv1.CodeCursorExpired:
			return ExitConflict
		case apiv1.CodeSKUUnavailable, apiv1.CodeQuotaExceeded:
			return ExitSKUUnavailable
		case apiv1.CodeUnavailable, apiv1.CodeRateLimited:
			return ExitUnavailable
		}
	}
	return ExitError
}
