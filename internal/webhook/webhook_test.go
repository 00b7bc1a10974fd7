package webhook_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/webhook"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, store.MigrateForTest)) }

const secret = "whsec_0123456789abcdef0123456789abcdef"

// receiver is a real local HTTPS endpoint that checks every delivery's signature, fails the
// first failFirst requests with 500 (or every one, failFirst < 0), and records what arrived.
type receiver struct {
	srv       *httptest.Server
	mu        sync.Mutex
	requests  int
	failFirst int
	got       []webhook.Payload
	badSig    int
}

func newReceiver(t *testing.T, failFirst int) *receiver {
	rc := &receiver{failFirst: failFirst}
	rc.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.requests++
		if err := webhook.Verify(secret, r.Header.Get(webhook.HeaderTimestamp), r.Header.Get(webhook.HeaderSignature), body, time.Now(), 5*time.Minute); err != nil {
			rc.badSig++
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if rc.failFirst < 0 || rc.requests <= rc.failFirst {
			http.Error(w, "not yet", http.StatusInternalServerError)
			return
		}
		var p webhook.Payload
		if err := json.Unmarshal(body, &p); err != nil || p.DeliveryID != r.Header.Get(webhook.HeaderID) {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		rc.got = append(rc.got, p)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) snapshot() (requests, badSig int, got []webhook.Payload) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.requests, rc.badSig, append([]webhook.Payload(nil), rc.got...)
}

func (rc *receiver) roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(rc.srv.Certificate())
	return p
}

type bundle struct {
	t      *testing.T
	url    string
	st     *store.Store
	tenant string
	hook   string
}

func setup(t *testing.T, hookURL string) *bundle {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	b := &bundle{t: t, url: pgtest.NewDatabase(t)}
	b.st = b.open()
	if err := b.st.InTx(ctx, func(tx *store.Tx) error {
		ten, err := tx.CreateTenant(ctx, "acme")
		if err != nil {
			return err
		}
		b.tenant = ten.ID
		h, err := tx.CreateWebhook(ctx, ten.ID, hookURL, secret)
		b.hook = h.ID
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return b
}

// open is a fresh pool: what a (re)started controller replica has.
func (b *bundle) open() *store.Store {
	st, err := store.Open(context.Background(), b.url, store.Options{})
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(st.Close)
	return st
}

func (b *bundle) emit(n int, tenant string) {
	b.t.Helper()
	ctx := context.Background()
	if err := b.st.InTx(ctx, func(tx *store.Tx) error {
		for i := range n {
			if err := tx.AppendEvent(ctx, store.NewEvent{Type: "test.event", TenantID: tenant, Data: map[string]int{"n": i}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.t.Fatal(err)
	}
}

// run starts a deliverer (one controller replica's) until the returned stop is called.
func run(st *store.Store, cfg webhook.Config) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); webhook.New(st, cfg, nil).Run(ctx) }()
	return func() { cancel(); <-done }
}

func (b *bundle) deliveries(status string) []apiv1.WebhookDelivery {
	b.t.Helper()
	ds, err := b.st.WebhookDeliveries(context.Background(), b.hook, status, 500)
	if err != nil {
		b.t.Fatal(err)
	}
	return ds
}

func (b *bundle) waitFor(what string, cond func() bool) {
	b.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		if cond() {
			return
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-b.t.Context().Done():
		}
	}
	b.t.Fatalf("timed out waiting for %s", what)
}

func fast(rc *receiver) webhook.Config {
	return webhook.Config{Poll: 20 * time.Millisecond, BaseBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		MaxAge: time.Minute, RootCAs: rc.roots(), AllowPrivate: true}
}

// The receiver refuses the first two attempts; the replica that made the first one stops
// (a controller restart) and a new one, with only the database in common, delivers it,
// signed, with every attempt on record.
func TestDeliveryRetriesAndSurvivesRestart(t *testing.T) {
	rc := newReceiver(t, 2)
	b := setup(t, rc.srv.URL+"/hook")
	b.emit(1, b.tenant)
	b.emit(1, "") // an operator-only event goes to no tenant's webhook

	stop := run(b.st, fast(rc))
	b.waitFor("the first failed attempt", func() bool {
		ds := b.deliveries("")
		return len(ds) == 1 && len(ds[0].History) >= 1
	})
	stop()
	if _, _, got := rc.snapshot(); len(got) != 0 {
		t.Fatalf("delivered before the receiver accepted: %+v", got)
	}

	stop = run(b.open(), fast(rc))
	defer stop()
	b.waitFor("the delivery", func() bool { return len(b.deliveries("delivered")) == 1 })
	requests, badSig, got := rc.snapshot()
	if badSig != 0 || len(got) != 1 || got[0].Event.Type != "test.event" || got[0].WebhookID != b.hook || requests < 3 {
		t.Fatalf("receiver: %d requests, %d bad signatures, got %+v", requests, badSig, got)
	}
	// Every attempt is on record, numbered without a gap: the refused ones (500), one the
	// stop may have cut short (interrupted), and the last, accepted one.
	d := b.deliveries("delivered")[0]
	if d.Attempts < 3 || len(d.History) != d.Attempts || d.FinishedAt == nil || d.LastError != "" {
		t.Fatalf("delivery record: %+v", d)
	}
	refused, interrupted := 0, 0
	for i, a := range d.History {
		last := i == len(d.History)-1
		switch {
		case a.Attempt != i+1:
			t.Fatalf("attempt %d numbered %d: %+v", i+1, a.Attempt, d.History)
		case last && a.StatusCode != 200, !last && a.StatusCode == 200:
			t.Fatalf("attempts: %+v", d.History)
		case a.StatusCode == 500:
			refused++
		case !last && !strings.Contains(a.Error, "interrupted"):
			t.Fatalf("attempt %d: %+v", a.Attempt, a)
		case !last:
			interrupted++
		}
	}
	// The receiver refused two requests; an interrupted attempt's request may have been one.
	if refused < 1 || interrupted > 1 || refused+interrupted < 2 {
		t.Fatalf("%d refused and %d interrupted attempts on record: %+v", refused, interrupted, d.History)
	}
	if strings.Contains(string(got[0].Event.Data), "node") {
		t.Fatalf("payload: %s", got[0].Event.Data)
	}
}

// A receiver that never accepts: the delivery ends dead after its bounded retry time, with
// its attempts and last error visible.
func TestDeliveryGoesDeadAfterMaxAge(t *testing.T) {
	rc := newReceiver(t, -1)
	b := setup(t, rc.srv.URL)
	b.emit(1, b.tenant)
	cfg := fast(rc)
	cfg.MaxAge = 400 * time.Millisecond
	stop := run(b.st, cfg)
	defer stop()
	b.waitFor("a dead letter", func() bool { return len(b.deliveries("dead")) == 1 })
	d := b.deliveries("dead")[0]
	if d.Attempts < 2 || len(d.History) != d.Attempts || !strings.Contains(d.LastError, "500") || d.FinishedAt == nil ||
		d.FinishedAt.Sub(d.CreatedAt) > 5*time.Second {
		t.Fatalf("dead delivery: %+v", d)
	}
	hooks, err := b.st.ListWebhooks(context.Background(), b.tenant)
	if err != nil || len(hooks) != 1 || hooks[0].Dead != 1 || hooks[0].Pending != 0 {
		t.Fatalf("webhook counts: %+v %v", hooks, err)
	}
}

// Certificates are verified against the system roots unless the operator adds a CA, and
// internal addresses are refused unless allowed: the receiver never sees such a request.
func TestDeliveryRefusesUntrustedCertificateAndPrivateAddress(t *testing.T) {
	rc := newReceiver(t, 0)
	for name, cfg := range map[string]webhook.Config{
		"system roots only": {Poll: 20 * time.Millisecond, BaseBackoff: time.Hour, AllowPrivate: true},
		"private address":   {Poll: 20 * time.Millisecond, BaseBackoff: time.Hour, RootCAs: rc.roots()},
	} {
		t.Run(name, func(t *testing.T) {
			b := setup(t, rc.srv.URL)
			b.emit(1, b.tenant)
			stop := run(b.st, cfg)
			defer stop()
			b.waitFor("the refused attempt", func() bool {
				ds := b.deliveries("pending")
				return len(ds) == 1 && len(ds[0].History) == 1
			})
			d := b.deliveries("pending")[0]
			want := map[string]string{"system roots only": "not signed by a trusted authority", "private address": "private"}[name]
			if !strings.Contains(d.LastError, want) || d.History[0].StatusCode != 0 {
				t.Fatalf("attempt: %+v", d)
			}
		})
	}
	if requests, _, _ := rc.snapshot(); requests != 0 {
		t.Fatalf("the receiver got %d requests", requests)
	}
}

// Two replicas deliver one stream: every event arrives once.
func TestTwoReplicasDeliverEachEventOnce(t *testing.T) {
	rc := newReceiver(t, 0)
	b := setup(t, rc.srv.URL)
	const n = 60
	stopA := run(b.st, fast(rc))
	defer stopA()
	stopB := run(b.open(), fast(rc))
	defer stopB()
	for range n / 10 {
		b.emit(10, b.tenant)
	}
	b.waitFor("every delivery", func() bool { return len(b.deliveries("delivered")) == n })
	requests, badSig, got := rc.snapshot()
	seen := map[string]bool{}
	for _, p := range got {
		if seen[p.Event.Cursor] {
			t.Fatalf("event %s delivered twice", p.Event.Cursor)
		}
		seen[p.Event.Cursor] = true
	}
	if len(seen) != n || requests != n || badSig != 0 {
		t.Fatalf("%d distinct events, %d requests, %d bad signatures; want %d", len(seen), requests, badSig, n)
	}
}

func TestVerifyRefusesTamperingAndReplays(t *testing.T) {
	body := []byte(`{"event":{"type":"allocation.active"}}`)
	now := time.Unix(1_800_000_000, 0)
	ts := fmt.Sprint(now.Unix())
	sig := webhook.Sign(secret, ts, body)
	if err := webhook.Verify(secret, ts, sig, body, now, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"tampered body": webhook.Verify(secret, ts, sig, append([]byte(nil), append(body, ' ')...), now, 5*time.Minute),
		"other secret":  webhook.Verify(secret+"x", ts, sig, body, now, 5*time.Minute),
		"old timestamp": webhook.Verify(secret, ts, sig, body, now.Add(10*time.Minute), 5*time.Minute),
		"moved stamp":   webhook.Verify(secret, fmt.Sprint(now.Unix()+1), sig, body, now, 5*time.Minute),
		"bad stamp":     webhook.Verify(secret, "soon", sig, body, now, 5*time.Minute),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCheckURL(t *testing.T) {
	for _, bad := range []string{"http://hooks.example.com/x", "ftp://hooks.example.com", "https://", "https://user:pw@hooks.example.com/",
		"https://hooks.example.com/#frag", "https://127.0.0.1/x", "https://10.1.2.3/", "https://[::1]/", "https://169.254.169.254/latest",
		"https://100.64.0.1/", "https://0.0.0.0/", "https://hooks.example.com/a b", "https://[fd00::1]:8443/", "https://[::ffff:127.0.0.1]/"} {
		if err := webhook.CheckURL(bad, false); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for _, good := range []string{"https://hooks.example.com/gpuaas", "https://203.0.113.7:8443/x?y=1"} {
		if err := webhook.CheckURL(good, false); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
	if err := webhook.CheckURL("https://127.0.0.1:9443/", true); err != nil {
		t.Errorf("allowed private: %v", err)
	}
}

// The signature is the one docs/tenants.md's shell and Python recipes compute (this vector
// was computed with both: openssl dgst -sha256 -hmac, and Python's hmac).
func TestSignMatchesTheDocumentedRecipe(t *testing.T) {
	got := webhook.Sign("whsec_abc", "1800000000", []byte(`{"event":{"type":"allocation.active"}}`))
	if want := "v1=ceaa745791336cee8101f5046ad5858f4e8163c0fdd35b48e5b5136c0f7b7ce6"; got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

// Replicas claiming at the same moment never get the same delivery (SKIP LOCKED).
func TestConcurrentClaimsNeverShareADelivery(t *testing.T) {
	b := setup(t, "https://hooks.example.com/x")
	ctx := context.Background()
	const n = 200
	b.emit(n, b.tenant)
	for made := 0; made < n; {
		m, err := b.st.FanOutWebhooks(ctx, 500)
		if err != nil {
			t.Fatal(err)
		}
		made += m
	}
	var mu sync.Mutex
	claimed := map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ds, err := b.st.ClaimWebhookDeliveries(ctx, 5, time.Hour)
				if err != nil {
					t.Error(err)
					return
				}
				if len(ds) == 0 {
					return
				}
				mu.Lock()
				for _, d := range ds {
					claimed[d.ID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(claimed) != n {
		t.Fatalf("%d deliveries claimed, want %d", len(claimed), n)
	}
	for id, c := range claimed {
		if c != 1 {
			t.Fatalf("delivery %s claimed %d times", id, c)
		}
	}
}
