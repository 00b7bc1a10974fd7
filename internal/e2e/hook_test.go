package e2e

import (
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gpuaas/gpuaas/internal/webhook"
)

// hookReceiver is a script's webhook endpoint: a real HTTPS server in the test process that
// refuses the first failFirst requests with 500 and accepts the rest, counting requests whose
// signature verifies with the script's $HOOK_SECRET, and any that do not.
type hookReceiver struct {
	mu                      sync.Mutex
	failFirst               int
	requests, accepted, bad int
	secret                  func() string
	deliveries              map[string]bool // delivery ids accepted
}

var (
	hooksMu sync.Mutex
	hooks   = map[string]*hookReceiver{} // by the script's $WORK
)

// hookReceiverCmd starts the script's receiver. Usage: hookreceiver FAILFIRST. It sets
// $HOOK_URL and $HOOK_CA (the receiver's certificate, for --webhook-ca-file).
func hookReceiverCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: hookreceiver FAILFIRST")
	}
	n, err := strconv.Atoi(args[0])
	ts.Check(err)
	rc := &hookReceiver{failFirst: n, secret: func() string { return ts.Getenv("HOOK_SECRET") }, deliveries: map[string]bool{}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.requests++
		if webhook.Verify(rc.secret(), r.Header.Get(webhook.HeaderTimestamp), r.Header.Get(webhook.HeaderSignature), body, time.Now(), 5*time.Minute) != nil {
			rc.bad++
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		if rc.requests <= rc.failFirst {
			http.Error(w, "not yet", http.StatusInternalServerError)
			return
		}
		rc.accepted++
		rc.deliveries[r.Header.Get(webhook.HeaderID)] = true
	}))
	ts.Defer(srv.Close)
	ca := filepath.Join(ts.Getenv("WORK"), "hook-ca.pem")
	ts.Check(os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644))
	ts.Setenv("HOOK_URL", srv.URL+"/gpuaas")
	ts.Setenv("HOOK_CA", ca)
	hooksMu.Lock()
	hooks[ts.Getenv("WORK")] = rc
	hooksMu.Unlock()
}

// waitHook waits until the receiver has seen N requests, or accepted N signed deliveries;
// a request with a bad signature fails it. Usage: waithook requests|accepted N [timeout]
func waitHook(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 || (args[0] != "requests" && args[0] != "accepted") {
		ts.Fatalf("usage: waithook requests|accepted N [timeout]")
	}
	n, err := strconv.Atoi(args[1])
	ts.Check(err)
	timeout := 60 * time.Second
	if len(args) == 3 {
		timeout, err = time.ParseDuration(args[2])
		ts.Check(err)
	}
	hooksMu.Lock()
	rc := hooks[ts.Getenv("WORK")]
	hooksMu.Unlock()
	if rc == nil {
		ts.Fatalf("no hookreceiver in this script")
	}
	for deadline := time.Now().Add(timeout); ; {
		rc.mu.Lock()
		requests, accepted, bad, distinct := rc.requests, rc.accepted, rc.bad, len(rc.deliveries)
		rc.mu.Unlock()
		if bad > 0 {
			ts.Fatalf("the receiver got %d requests whose signature did not verify", bad)
		}
		if (args[0] == "requests" && requests >= n) || (args[0] == "accepted" && accepted >= n) {
			ts.Logf("receiver: %d requests, %d accepted (%d distinct deliveries)", requests, accepted, distinct)
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("receiver: %d requests, %d accepted after %s; want %s %d", requests, accepted, timeout, args[0], n)
		}
		time.Sleep(50 * time.Millisecond) // poll; the deadline bounds it
	}
}
