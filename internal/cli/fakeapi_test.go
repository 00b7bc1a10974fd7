package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

// fakeAPI is an HTTPS server answering the routes a test gives it, the way the controller
// does; anything else is a JSON not_found. The real controller is exercised end to end by
// testdata/script; these tests pin the CLI's own behaviour: flags, requests, output formats,
// and the error-to-exit-status mapping.
type fakeAPI struct {
	URL    string
	CAFile string

	mu   sync.Mutex
	reqs []seenRequest
}

type seenRequest struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
}

func newFakeAPI(t *testing.T, routes map[string]http.HandlerFunc) *fakeAPI {
	t.Helper()
	fa := &fakeAPI{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body)) // handlers may read it too
		fa.mu.Lock()
		fa.reqs = append(fa.reqs, seenRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body})
		fa.mu.Unlock()
		if h, ok := routes[r.Method+" "+r.URL.Path]; ok {
			h(w, r)
			return
		}
		reply(404, apiv1.Error{Code: apiv1.CodeNotFound, Message: "no such endpoint: " + r.Method + " " + r.URL.Path})(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // untrusted-CA tests cause handshake errors
	srv.StartTLS()
	t.Cleanup(srv.Close)
	fa.URL = srv.URL
	fa.CAFile = filepath.Join(t.TempDir(), "ca.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(fa.CAFile, ca, 0o644); err != nil {
		t.Fatal(err)
	}
	return fa
}

// env is the environment pointing gpuaasctl at the fake API with an admin token.
func (fa *fakeAPI) env(t *testing.T) map[string]string {
	return map[string]string{"HOME": t.TempDir(), "GPUAAS_SERVER": fa.URL, "GPUAAS_CA_FILE": fa.CAFile, "GPUAAS_TOKEN": "admin-token"}
}

func (fa *fakeAPI) requests() []seenRequest {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return append([]seenRequest(nil), fa.reqs...)
}

func (fa *fakeAPI) last(t *testing.T) seenRequest {
	t.Helper()
	r := fa.requests()
	if len(r) == 0 {
		t.Fatal("no request reached the fake API")
	}
	return r[len(r)-1]
}

func reply(status int, v any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
}

// result is one in-process gpuaasctl run.
type result struct {
	Code        int
	Out, ErrOut string
}

// run runs gpuaasctl in-process with env as its whole environment and buffer streams.
func run(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	return runStdin(t, env, "", args...)
}

func runStdin(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	ios := cmdutil.IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut}
	code := Run(context.Background(), args, ios, func(k string) string { return env[k] })
	return result{code, out.String(), errOut.String()}
}
