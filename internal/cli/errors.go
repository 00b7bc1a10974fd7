package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
)

// Exit codes (documented in the root command's help).
const (
	ExitOK             = 0
	ExitError          = 1
	ExitUsage          = 2
	ExitAuth           = 3
	ExitNotFound       = 4
	ExitConflict       = 5
	ExitSKUUnavailable = 6
	ExitUnavailable    = 7
)

// FlagError is a usage mistake: the only error that prints usage.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

// AuthError is a missing or rejected credential.
type AuthError struct{ Err error }

func (e *AuthError) Error() string { return e.Err.Error() }
func (e *AuthError) Unwrap() error { return e.Err }

// SilentError exits with Code having printed its own output.
type SilentError struct{ Code int }

func (e *SilentError) Error() string { return fmt.Sprintf("exit %d", e.Code) }

// exitCode maps an error to the process exit code, in one place.
func exitCode(err error) int {
	var fe *FlagError
	var ae *AuthError
	var se *SilentError
	var api *apiv1.Error
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &se):
		return se.Code
	case errors.As(err, &fe):
		return ExitUsage
	case errors.As(err, &ae):
		return ExitAuth
	case errors.Is(err, client.ErrUnreachable):
		return ExitUnavailable
	case errors.As(err, &api):
		switch api.Code {
		case apiv1.CodeInvalidRequest, apiv1.CodeTooLarge:
			return ExitUsage
		case apiv1.CodeUnauthorized, apiv1.CodeForbidden:
			return ExitAuth
		case apiv1.CodeNotFound:
			return ExitNotFound
		case apiv1.CodeConflict, apiv1.CodeIdempotencyReused:
			return ExitConflict
		case apiv1.CodeSKUUnavailable:
			return ExitSKUUnavailable
		case apiv1.CodeUnavailable:
			return ExitUnavailable
		}
	}
	return ExitError
}

// printError writes "error: ..." and a hint.
func printError(w io.Writer, err error, server string) {
	var se *SilentError
	if errors.As(err, &se) {
		return
	}
	var api *apiv1.Error
	if errors.As(err, &api) {
		fmt.Fprintf(w, "error: %s (%s)\n", api.Message, api.Code)
		switch api.Code {
		case apiv1.CodeSKUUnavailable:
			if r, ok := api.Details["reason"]; ok {
				fmt.Fprintf(w, "reason: %v\n", r)
			}
			fmt.Fprintln(w, "hint: `gpuaasctl alloc explain` and `gpuaasctl capacity` show what could be placed")
		case apiv1.CodeUnauthorized:
			fmt.Fprintln(w, "hint: check --token / --token-file / GPUAAS_TOKEN")
		case apiv1.CodeForbidden:
			fmt.Fprintln(w, "hint: this needs an admin token")
		case apiv1.CodeUnavailable:
			fmt.Fprintln(w, "hint: retry; the controller or its database is temporarily unavailable")
		}
		return
	}
	fmt.Fprintf(w, "error: %v\n", err)
	var ae *AuthError
	switch {
	case errors.Is(err, client.ErrUnreachable):
		fmt.Fprintf(w, "hint: is the controller running at %s? (--server, --ca-file)\n", server)
	case errors.As(err, &ae):
		fmt.Fprintln(w, "hint: an admin finds the first token in STATE_DIR/admin.token")
	}
}
