package apibench

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/client"
)

// wireServer is a TLS server answering as the controller does, counting the connections it
// accepts in conns (when not nil), and a wire client for it.
func wireServer(t *testing.T, conns *atomic.Int32, h http.HandlerFunc) (*wire, *httptest.Server) {
	t.Helper()
	ts := httptest.NewUnstartedServer(h)
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew && conns != nil {
			conns.Add(1)
		}
	}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := newWire(ts.URL, ca, "tok-123")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w, ts
}

func TestWireSendsWhatTheAPIExpectsAndChecksTheAnswers(t *testing.T) {
	var conns atomic.Int32
	w, ts := wireServer(t, &conns, func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok-123" || r.Proto != "HTTP/1.1" {
			http.Error(rw, "bad auth or protocol "+r.Proto, http.StatusUnauthorized)
			return
		}
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/allocations":
			var req apiv1.AllocationCreate
			if r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&req) != nil ||
				req.SKU != benchenv.SliceSKU || req.GPUs != GPUs {
				http.Error(rw, "bad create body", http.StatusBadRequest)
				return
			}
			rw.WriteHeader(http.StatusCreated)
			io.WriteString(rw, `{"id":"a-1","status":"requested","claims":[{"slot_id":"s"}]}`)
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/allocations/a-1/release":
			io.WriteString(rw, `{"id":"a-1","status":"released"}`)
		case r.URL.Path == "/api/v1/allocations/a-2/release": // answers for another allocation
			io.WriteString(rw, `{"id":"a-1"}`)
		default:
			http.NotFound(rw, r)
		}
	})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		id, err := w.Create(ctx)
		if err != nil || id != "a-1" {
			t.Fatalf("create %d: %q, %v", i, id, err)
		}
		if err := w.Release(ctx, id); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("6 requests used %d connections, want 1 kept alive", n)
	}
	ts.CloseClientConnections() // as an idle timeout would: the next request redials
	if id, err := w.Create(ctx); err != nil || id != "a-1" {
		t.Fatalf("create after the server closed the idle connection: %q, %v", id, err)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections after the server closed one, want 2", n)
	}
	if err := w.Release(ctx, "a-2"); err == nil || !strings.Contains(err.Error(), "another allocation") {
		t.Errorf("a release answered for another allocation: %v", err)
	}
	var ae *apiv1.Error
	if err := w.Release(ctx, "nope"); !errors.As(err, &ae) || ae.Code != apiv1.CodeNotFound {
		t.Errorf("release of an unknown id: %v, want a not_found API error", err)
	}
}

func TestWireReportsTheControllersErrorsAndRedialsAClosedConnection(t *testing.T) {
	var calls atomic.Int32
	w, _ := wireServer(t, nil, func(rw http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1: // the controller's capacity refusal
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusConflict)
			io.WriteString(rw, `{"code":"sku_unavailable","message":"no node fits"}`)
		case 2: // an answer closing the connection
			rw.Header().Set("Connection", "close")
			rw.WriteHeader(http.StatusCreated)
			io.WriteString(rw, `{"id":"a-2"}`)
		case 3: // chunked, on the new connection
			rw.WriteHeader(http.StatusCreated)
			io.WriteString(rw, `{"id":`)
			rw.(http.Flusher).Flush()
			io.WriteString(rw, `"a-3"}`)
		default: // a 2xx that is not an allocation
			rw.WriteHeader(http.StatusCreated)
			io.WriteString(rw, `{}`)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := w.Create(ctx); !isUnavailable(err) {
		t.Fatalf("a 409 sku_unavailable answer: %v, want isUnavailable", err)
	}
	if id, err := w.Create(ctx); err != nil || id != "a-2" {
		t.Fatalf("create answered with Connection: close: %q, %v", id, err)
	}
	if w.conn != nil {
		t.Error("the connection the server closed is still in use")
	}
	if id, err := w.Create(ctx); err != nil || id != "a-3" {
		t.Fatalf("chunked create on a new connection: %q, %v", id, err)
	}
	if _, err := w.Create(ctx); err == nil || !strings.Contains(err.Error(), "without an allocation id") {
		t.Fatalf("a 201 without an id: %v", err)
	}
}

func TestWireRefusesPlainHTTPAndBadTokens(t *testing.T) {
	if _, err := newWire("http://127.0.0.1:1", "ca.pem", "t"); err == nil {
		t.Fatal("newWire accepted http://")
	}
	if _, err := newWire("https://127.0.0.1:1", "ca.pem", "t\r\nX-Admin: 1"); err == nil || !strings.Contains(err.Error(), "spans lines") {
		t.Fatalf("newWire accepted a token that would add a header: %v", err)
	}
}

func TestWireGivesUpOnAControllerThatDoesNotAnswer(t *testing.T) {
	release := make(chan struct{})
	w, _ := wireServer(t, nil, func(rw http.ResponseWriter, r *http.Request) { <-release })
	t.Cleanup(func() { close(release) }) // runs before the server's Close (cleanups run last-in first-out)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var ne *client.NetworkError
	if _, err := w.Create(ctx); !errors.As(err, &ne) {
		t.Fatalf("create against a silent server: %v, want a network error at the deadline", err)
	}
	if w.conn != nil {
		t.Error("the timed-out connection is kept for the next request")
	}
}

func TestWireDoesNotRepeatARequestWhoseAnswerWasCutShort(t *testing.T) {
	var creates atomic.Int32
	w, _ := wireServer(t, nil, func(rw http.ResponseWriter, r *http.Request) {
		if creates.Add(1) == 1 {
			rw.WriteHeader(http.StatusCreated)
			io.WriteString(rw, `{"id":"a-1"}`)
			return
		}
		// The second create was applied, and its answer dies half-way.
		conn, buf, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		buf.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{\"id\":")
		buf.Flush()
		conn.Close()
	})
	ctx := context.Background()
	if _, err := w.Create(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Create(ctx); err == nil { // on the kept-alive connection
		t.Fatal("a create whose answer was cut short succeeded")
	}
	if n := creates.Load(); n != 2 {
		t.Errorf("the controller saw %d creates, want 2: a cut-short answer must not be sent again", n)
	}
}
