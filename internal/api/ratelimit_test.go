package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// fakeClock is the limiters' clock: time moves only when the test says so.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// doHeader is w.do with the answer's headers.
func (w *secWorld) doHeader(method, path, bearer string, body any) (int, http.Header, []byte) {
	w.t.Helper()
	req, err := http.NewRequest(method, w.srv.URL+path, bodyOf(body))
	if err != nil {
		w.t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := w.plain.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, out
}

// Failed authentications from one address are answered 429 with Retry-After once its
// bucket is spent, while valid tokens and certificates from the same address keep working;
// the bucket refills with (injected) time. Failed enrollments have their own bucket.
func TestAuthFailuresAndEnrollmentRateLimited(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	w := secSetup(t, api.SecurityConfig{AuthFailures: api.RateLimit{Burst: 3, Every: time.Minute},
		Enroll: api.RateLimit{Burst: 2, Every: time.Minute}, Now: clock.Now})
	w.populate() // enrolls nodes X and Y: successful enrollments spend nothing

	// Enrollment failures have their own bucket: two unknown bootstrap tokens, then 429;
	// a valid (one-time) token still enrolls, and failed API authentications are untouched.
	_, pubPEM := enrollKey(t)
	for i := range 2 {
		bad := apiv1.EnrollRequest{BootstrapToken: "gpb_guess_" + string(rune('a'+i)), PublicKeyPEM: pubPEM}
		if code, _, body := w.doHeader("POST", "/api/v1/agent/enroll", "", bad); code != 401 {
			t.Fatalf("bad enrollment %d = %d %s", i, code, body)
		}
	}
	code, hdr, body := w.doHeader("POST", "/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: "gpb_guess_c", PublicKeyPEM: pubPEM})
	if code != 429 || hdr.Get("Retry-After") != "60" || !strings.Contains(string(body), "enrollments") {
		t.Fatalf("3rd failed enrollment in a minute = %d Retry-After=%q %s", code, hdr.Get("Retry-After"), body)
	}
	var n apiv1.Node
	w.must("POST", "/api/v1/admin/nodes", w.admin, apiv1.NodeCreate{Name: "node-late", Region: "lab"}, 201, &n)
	w.must("POST", "/api/v1/agent/enroll", "", apiv1.EnrollRequest{BootstrapToken: n.BootstrapToken, PublicKeyPEM: pubPEM}, 201, nil)

	for i := range 3 {
		if code, _, body := w.doHeader("GET", "/api/v1/whoami", "gpa_guess_"+string(rune('a'+i)), nil); code != 401 {
			t.Fatalf("failure %d = %d %s", i, code, body)
		}
	}
	code, hdr, body = w.doHeader("GET", "/api/v1/whoami", "gpa_guess_d", nil)
	var e apiv1.Error
	_ = json.Unmarshal(body, &e)
	if code != 429 || hdr.Get("Retry-After") != "60" || e.Code != apiv1.CodeRateLimited {
		t.Fatalf("4th failure = %d Retry-After=%q %s", code, hdr.Get("Retry-After"), body)
	}
	if code, _, _ := w.doHeader("GET", "/api/v1/allocations", "", nil); code != 429 {
		t.Fatalf("anonymous from a throttled address = %d", code)
	}
	// Valid credentials from the same address are not throttled.
	for range 5 {
		w.must("GET", "/api/v1/whoami", w.tenA, nil, 200, nil)
	}
	if code, body := call(t, w.nodeX.client, "POST", w.srv.URL+"/api/v1/agent/heartbeat", "", apiv1.Heartbeat{AgentVersion: "t", Runtime: "sim"}); code != 204 {
		t.Fatalf("node certificate from a throttled address = %d %s", code, body)
	}
	clock.advance(30 * time.Second)
	if code, hdr, _ := w.doHeader("GET", "/api/v1/whoami", "gpa_guess_e", nil); code != 429 || hdr.Get("Retry-After") != "30" {
		t.Fatalf("half a minute later = %d Retry-After=%q", code, hdr.Get("Retry-After"))
	}
	clock.advance(30 * time.Second)
	if code, _, _ := w.doHeader("GET", "/api/v1/whoami", "gpa_guess_f", nil); code != 401 {
		t.Fatalf("after the refill = %d, want one more 401", code)
	}
	if code, _, _ := w.doHeader("GET", "/api/v1/whoami", "gpa_guess_g", nil); code != 429 {
		t.Fatalf("the refill was one attempt; got %d", code)
	}

}
