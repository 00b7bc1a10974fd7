package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// deadAddr is a loopback address nothing listens on (connection refused).
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "https://" + addr
}

func (fs *fakeServer) count() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.reqs)
}

// A client given several replicas moves past a dead one, and stays on the live one.
func TestFailoverToTheNextReplica(t *testing.T) {
	live := newFake(t, map[string]http.HandlerFunc{"GET /api/v1/whoami": reply(200, apiv1.Whoami{Role: "tenant"})})
	dead := deadAddr(t)
	c, err := New(Options{Server: dead + ", " + live.URL, CAFile: live.CAFile, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Server() != dead {
		t.Fatalf("first request should go to the first replica, Server() = %q", c.Server())
	}
	w, err := c.Whoami(context.Background())
	if err != nil || w.Role != "tenant" {
		t.Fatalf("whoami through the second replica: %v %#v", err, w)
	}
	if c.Server() != live.URL || live.count() != 1 {
		t.Fatalf("client should now use %s (got %s), live saw %d requests", live.URL, c.Server(), live.count())
	}
	// A non-idempotent POST whose connection was refused was never sent: it fails over too.
	c2, err := New(Options{Server: dead + "," + live.URL, CAFile: live.CAFile, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.CreateTenant(context.Background(), "acme"); !errors.As(err, new(*apiv1.Error)) || live.last(t).Method != "POST" {
		t.Fatalf("POST after a refused connection should reach the live replica (its 404 is fine): %v", err)
	}
	// Bad entries are refused up front, whichever position they hold.
	for _, s := range []string{live.URL + ",http://x:1", "https://a:1,,ftp://b"} {
		if _, err := New(Options{Server: s}); !errors.Is(err, ErrInvalidServer) {
			t.Fatalf("New(%q) = %v, want ErrInvalidServer", s, err)
		}
	}
}

// 503 unavailable (the database is away: nothing applied) is retried for a request that is
// safe to repeat, never for a POST without an idempotency key (it might have committed).
func TestUnavailableRetriedOnlyWhenSafe(t *testing.T) {
	down := reply(503, apiv1.Error{Code: apiv1.CodeUnavailable, Message: "database unavailable; retry"})
	a := newFake(t, map[string]http.HandlerFunc{"POST /api/v1/allocations": down, "POST /api/v1/admin/tenants": down})
	b := newFake(t, map[string]http.HandlerFunc{
		"POST /api/v1/allocations":   reply(201, apiv1.Allocation{ID: "a1"}),
		"POST /api/v1/admin/tenants": reply(201, apiv1.Tenant{ID: "t1"}),
	})
	c, err := New(Options{Server: a.URL + "," + b.URL, CAFile: a.CAFile, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	al, err := c.CreateAllocation(context.Background(), apiv1.AllocationCreate{SKU: "s", GPUs: 1}, "key-1")
	if err != nil || al.ID != "a1" {
		t.Fatalf("create with a key should fail over past the 503: %v", err)
	}
	if got := b.last(t).Header.Get("Idempotency-Key"); got != "key-1" {
		t.Fatalf("the retry must carry the same key, got %q", got)
	}
	c, err = New(Options{Server: a.URL + "," + b.URL, CAFile: a.CAFile, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	before := b.count()
	_, err = c.CreateTenant(context.Background(), "acme")
	var ae *apiv1.Error
	if !errors.As(err, &ae) || ae.Code != apiv1.CodeUnavailable || b.count() != before {
		t.Fatalf("POST without a key must return the 503, not retry elsewhere: %v (second replica saw %d new)", err, b.count()-before)
	}
}
