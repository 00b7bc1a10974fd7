package api_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// sqlText matches phrases only PostgreSQL's own messages carry, which a client must never see:
// constraint violations, type syntax errors, SQLSTATEs, relation and column names. The phrases
// are whole and case-sensitive: answers also carry random tokens, which may spell "PgX".
var sqlText = regexp.MustCompile(`violates (unique|foreign key|check|not-null|exclusion) constraint|duplicate key value|` +
	`invalid input syntax for|SQLSTATE|relation \\?"[a-z_]+\\?"|column \\?"[a-z_]+\\?"|for type uuid|_fkey\\?"|_pkey\\?"|_key\\?"|pgx: |pq: `)

// TestNoSQLTextReachesClients walks the admin and user endpoints with bad ids, duplicates and
// dangling references: every answer is a 4xx in our words, none names a constraint, table or
// SQL type.
func TestNoSQLTextReachesClients(t *testing.T) {
	b := setup(t)
	b.world()
	zero := "00000000-0000-7000-8000-000000000000"
	cases := []struct {
		method, path string
		body         any
		wantCode     int
		wantText     string
	}{
		{"POST", "/api/v1/admin/tenants", map[string]string{"name": "acme"}, 409, "tenant name already taken"},
		{"POST", "/api/v1/admin/nodes", apiv1.NodeCreate{Name: "n1", Region: "lab", SliceSKU: "h200-sxm-slice"}, 409, "node name already taken"},
		{"POST", "/api/v1/admin/tokens", apiv1.TokenCreate{Name: "x", Role: "tenant", TenantID: zero}, 0, ""},
		{"POST", "/api/v1/admin/tokens", apiv1.TokenCreate{Name: "x", Role: "tenant", TenantID: "not-a-uuid"}, 0, ""},
		{"POST", "/api/v1/admin/nodes", apiv1.NodeCreate{Name: "n9", Region: "lab", SliceSKU: "no-such-sku"}, 0, ""},
		{"POST", "/api/v1/admin/os-images", apiv1.OSImage{Slug: "img", DisplayName: "img", Version: "1", Target: "vm_slice", Family: "debian",
			Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://images.example/img.qcow2",
			DigestSHA256: strings.Repeat("0f", 32), DefaultUsername: "debian", DriverStrategy: "none"}, 409, ""},
		{"GET", "/api/v1/admin/nodes/" + zero, nil, 404, ""},
		{"GET", "/api/v1/allocations/not-a-uuid", nil, 0, ""},
		{"POST", "/api/v1/allocations/not-a-uuid/release", nil, 0, ""},
		{"POST", "/api/v1/admin/tokens/not-a-uuid/revoke", nil, 0, ""},
		{"GET", "/api/v1/tasks/not-a-uuid", nil, 0, ""},
		{"GET", "/api/v1/sessions/not-a-uuid", nil, 0, ""},
		{"POST", "/api/v1/allocations", apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 1, TenantID: zero}, 0, ""},
		{"POST", "/api/v1/placement/explain", apiv1.PlacementRequest{SKU: "h200-sxm-slice", GPUs: 1, TenantID: "x"}, 0, ""},
	}
	for _, c := range cases {
		code, body := b.do(c.method, c.path, b.admin, c.body)
		cell := c.method + " " + c.path
		switch {
		case code >= 500:
			t.Errorf("%s: %d %s", cell, code, body)
		case code < 400:
			t.Errorf("%s: %d, want a refusal: %s", cell, code, body)
		case c.wantCode != 0 && code != c.wantCode:
			t.Errorf("%s: %d, want %d: %s", cell, code, c.wantCode, body)
		case sqlText.Match(body):
			t.Errorf("%s: the answer carries SQL text: %s", cell, body)
		case c.wantText != "" && !strings.Contains(string(body), c.wantText):
			t.Errorf("%s: the answer lacks %q: %s", cell, c.wantText, body)
		}
	}
}
