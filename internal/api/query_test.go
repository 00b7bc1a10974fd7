package api

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestUnknownQueryParametersAreRefused: a parameter the route does not read is a 400 naming
// the ones it does (?target=zzz on the audit log used to return everything); a route that
// reads none says so; every route the table of known parameters names exists.
func TestUnknownQueryParametersAreRefused(t *testing.T) {
	req := func(raw string) *http.Request { return &http.Request{URL: &url.URL{RawQuery: raw}} }
	if err := checkQueryNames(req("target_id=x&limit=5&action=a"), "GET /api/v1/admin/audit"); err != nil {
		t.Fatalf("known parameters refused: %v", err)
	}
	err := checkQueryNames(req("target=zzz"), "GET /api/v1/admin/audit")
	if !isBadRequest(err) || !strings.Contains(err.Error(), `unknown query parameter "target"`) || !strings.Contains(err.Error(), "target_id") {
		t.Fatalf("?target= on the audit log: %v", err)
	}
	if err := checkQueryNames(req("x=1"), "GET /api/v1/whoami"); !isBadRequest(err) || !strings.Contains(err.Error(), "takes none") {
		t.Fatalf("a parameter on a route that takes none: %v", err)
	}
	routes := map[string]bool{}
	for _, rt := range (&Server{}).table() {
		routes[rt.method+" "+rt.path] = true
	}
	for r := range queryParams {
		if !routes[r] {
			t.Errorf("queryParams names %q, which is not a route", r)
		}
	}
}
