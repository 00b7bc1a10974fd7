package telemetry

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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

// Tokens are kept in the state directory (file 0600, directory 0700): a registry opened
// again (a restarted hostd) accepts the token a running guest carries and hands the same
// one to a retried provision; a revoked token stays revoked; a tokens file others may read
// is refused.
func TestTokensSurviveRestartPrivately(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "telemetry")
	r, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := r.Register("a1")
	gone, _ := r.Register("a2")
	if err := r.Unregister("a2"); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, TokensFile): 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Fatalf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}

	restarted, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(restarted.Handler())
	defer srv.Close()
	if code := post(t, srv.URL, tok, `{"gpu_util": 5}`); code != 204 {
		t.Fatalf("the guest's token after a restart: %d", code)
	}
	if again, _ := restarted.Register("a1"); again != tok {
		t.Fatal("a retried provision after a restart got a new token; the running guest has the old one")
	}
	if code := post(t, srv.URL, gone, `{}`); code != 401 {
		t.Fatalf("a revoked token came back after a restart: %d", code)
	}

	if err := os.Chmod(filepath.Join(dir, TokensFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRegistry(dir); err == nil || !strings.Contains(err.Error(), "0600") {
		t.Fatalf("world-readable tokens file: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, TokensFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, TokensFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRegistry(dir); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt tokens file: %v", err)
	}
}

// OnReport sees each accepted report (and only those), after it is stored.
func TestOnReportSeesAcceptedReports(t *testing.T) {
	r := NewRegistry()
	var got []string
	r.OnReport = func(alloc string, body []byte) {
		if _, ok := r.Latest(alloc); !ok {
			t.Error("OnReport ran before the report was stored")
		}
		got = append(got, alloc+" "+string(body))
	}
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	tok, _ := r.Register("a1")
	if code := post(t, srv.URL, tok, `{"xid":[{"gpu_index":0,"code":79}]}`); code != 204 {
		t.Fatalf("report = %d", code)
	}
	if code := post(t, srv.URL, "wrong", `{"xid":[]}`); code != 401 {
		t.Fatalf("bad token = %d", code)
	}
	if code := post(t, srv.URL, tok, `[1]`); code != 400 {
		t.Fatalf("not an object = %d", code)
	}
	if len(got) != 1 || got[0] != `a1 {"xid":[{"gpu_index":0,"code":79}]}` {
		t.Fatalf("OnReport saw %q", got)
	}
}
