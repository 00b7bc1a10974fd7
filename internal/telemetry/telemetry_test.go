package telemetry

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func post(t *testing.T, url, token, body string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/internal/v1/guest-telemetry", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestPerAllocationTokens(t *testing.T) {
	r := NewRegistry()
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	t1, _ := r.Register("a1")
	if again, _ := r.Register("a1"); again != t1 {
		t.Fatal("re-registering changed the token (provision must be idempotent)")
	}
	t2, _ := r.Register("a2")
	if code := post(t, srv.URL, t1, `{"gpu_util": 97}`); code != 204 {
		t.Fatalf("report = %d", code)
	}
	if rep, ok := r.Latest("a1"); !ok || !strings.Contains(string(rep.Body), "97") {
		t.Fatalf("latest a1 = %+v", rep)
	}
	if _, ok := r.Latest("a2"); ok {
		t.Fatal("a1's report landed on a2")
	}
	for name, c := range map[string]struct {
		tok, body string
		want      int
	}{
		"no token":   {"", `{}`, 401},
		"bad token":  {"gpt_nope", `{}`, 401},
		"not object": {t2, `[1,2]`, 400},
		"not json":   {t2, `gpu=1`, 400},
		"too big":    {t2, `{"x":"` + strings.Repeat("a", MaxBody) + `"}`, 413},
	} {
		if code := post(t, srv.URL, c.tok, c.body); code != c.want {
			t.Errorf("%s: %d, want %d", name, code, c.want)
		}
	}
	r.Unregister("a1")
	if code := post(t, srv.URL, t1, `{}`); code != 401 {
		t.Fatalf("unregistered token = %d", code)
	}
	if _, ok := r.Latest("a1"); ok {
		t.Fatal("reports kept after unregister")
	}
}
