package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/client"
)

// printError writes "error: ..." and, where it helps, a reason and a hint line.
func printError(w io.Writer, f *cmdutil.Factory, err error) {
	var se *cmdutil.SilentError
	if errors.As(err, &se) {
		return
	}
	var api *apiv1.Error
	if errors.As(err, &api) {
		fmt.Fprintf(w, "error: %s (%s)\n", api.Message, api.Code)
		if hint := apiHint(f, api); hint != "" {
			fmt.Fprintln(w, hint)
		}
		return
	}
	fmt.Fprintf(w, "error: %v\n", err)
	var (
		ne *client.NetworkError
		ae *cmdutil.AuthError
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		hn x509.HostnameError
	)
	switch {
	case errors.As(err, &cv) || errors.As(err, &ua):
		fmt.Fprintln(w, "hint: the controller's certificate is not trusted: pass --ca-file (or GPUAAS_CA_FILE) with the controller's STATE_DIR/tls/ca.crt")
	case errors.As(err, &hn):
		fmt.Fprintln(w, "hint: the certificate does not name this host: use the address the controller's certificate was issued for in --server")
	case errors.As(err, &ne):
		fmt.Fprintf(w, "hint: is the controller running at %s? (check --server or GPUAAS_SERVER)\n", ne.URL)
	case errors.As(err, &ae):
		fmt.Fprintln(w, "hint: the controller writes the first admin token to STATE_DIR/admin.token")
	}
}

func apiHint(f *cmdutil.Factory, e *apiv1.Error) string {
	switch e.Code {
	case apiv1.CodeSKUUnavailable:
		h := ""
		if r, ok := e.Details["reason"]; ok {
			h = fmt.Sprintf("reason: %v\n", r)
		}
		return h + "hint: 'gpuaasctl alloc explain --sku SKU --gpus N' shows why; 'gpuaasctl capacity' shows what can be placed now"
	case apiv1.CodeQuotaExceeded:
		return "hint: 'gpuaasctl quota' shows your limits and what counts against them; releasing allocations or cancelling reservations frees quota at once"
	case apiv1.CodeUnauthorized:
		h := "hint: check --token / --token-file / GPUAAS_TOKEN / GPUAAS_TOKEN_FILE"
		if cfg, err := f.Config(); err == nil && cfg.TokenSource != "" {
			h += "; the token in use came from " + cfg.TokenSource
		}
		return h
	case apiv1.CodeForbidden:
		return "hint: this needs an admin token"
	case apiv1.CodeIdempotencyReused:
		return "hint: this --idempotency-key was already used for a different request; use a new key"
	case apiv1.CodeUnavailable:
		return "hint: the controller or its database is temporarily unavailable; retry shortly"
	}
	return ""
}
