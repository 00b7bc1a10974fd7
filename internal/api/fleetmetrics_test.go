package api_test

import (
	"context"
	"crypto/tls"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// scrape reads /metrics into series (name plus labels, as exposed) -> value.
func (b *apiBundle) scrape() map[string]float64 {
	b.t.Helper()
	code, body := b.do("GET", "/metrics", "", nil)
	if code != 200 {
		b.t.Fatalf("/metrics = %d: %s", code, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			b.t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// The alerting rules (deploy/prometheus) are written against these series: each one must be
// exported with the figures the database holds.
func TestMetricsReportFleetState(t *testing.T) {
	b := setup(t)
	b.world()
	b.must("POST", "/api/v1/allocations", b.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2}, 201, nil)
	// A failed task of the last minutes and a failed (unverified) wipe proof.
	b.sql(`INSERT INTO node_tasks (node_id, type, payload, status, not_after, completed_at, error)
		SELECT id, 'slice.vm_provision', '{}', 'failed', now() + interval '1 hour', now(), 'boom' FROM nodes WHERE name = 'n1'`)
	b.sql(`INSERT INTO slot_wipe_proofs (slot_id, node_id, verified, error)
		SELECT s.id, s.node_id, false, 'readback not zero' FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
		WHERE n.name = 'n1' AND s.slot_index = 7`)

	b.sql(`INSERT INTO nodes (name, region, last_heartbeat_at) VALUES ('silent', 'lab', now() - interval '1 hour')`)
	m := b.scrape()
	want := map[string]float64{
		`gpuaas_database_up`:                                                    1,
		`gpuaas_nodes{status="active"}`:                                         2,
		`gpuaas_nodes_heartbeat_stale`:                                          1, // silent; n1, never heard from (not enrolled), is not counted
		`gpuaas_slots{status="available"}`:                                      6,
		`gpuaas_slots{status="cleanup_blocked"}`:                                0,
		`gpuaas_allocations{status="requested"}`:                                1,
		`gpuaas_sku_gpus{sku="h200-sxm-slice"}`:                                 8,
		`gpuaas_sku_gpus_free{sku="h200-sxm-slice"}`:                            6,
		`gpuaas_sku_gpus{sku="h200-sxm-baremetal-8g"}`:                          8,
		`gpuaas_sku_gpus_free{sku="h200-sxm-baremetal-8g"}`:                     0, // a slice claim holds the node
		`gpuaas_tasks_failed_recent{status="failed",type="slice.vm_provision"}`: 1,
		`gpuaas_wipe_failures_recent`:                                           1,
		`gpuaas_provisioning_recent_count`:                                      0,
	}
	for k, v := range want {
		got, ok := m[k]
		if !ok {
			t.Errorf("/metrics lacks %s", k)
		} else if got != v {
			t.Errorf("%s = %v, want %v", k, got, v)
		}
	}
	if m[`gpuaas_slots{status="reserved"}`]+m[`gpuaas_slots{status="provisioning"}`] != 2 {
		t.Errorf("slots reserved+provisioning = %v, want 2", m[`gpuaas_slots{status="reserved"}`]+m[`gpuaas_slots{status="provisioning"}`])
	}
	if _, ok := m[`gpuaas_allocations_provisioning_oldest_seconds`]; !ok {
		t.Error("/metrics lacks gpuaas_allocations_provisioning_oldest_seconds")
	}
	if _, ok := m[`gpuaas_tasks_pending_oldest_seconds`]; !ok {
		t.Error("/metrics lacks gpuaas_tasks_pending_oldest_seconds")
	}
}

// The certificate expiries the alert reads: the controller's CA and server certificate as
// loaded, and the earliest of the active nodes' newest unrevoked node certificates.
func TestMetricsReportCertificateExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	st, err := store.Open(ctx, dsn, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	dir := t.TempDir()
	if _, err := pki.Init(pki.InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(pki.Paths{Dir: dir}.ServerCert(), pki.Paths{Dir: dir}.ServerKey())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(api.New(api.Options{Store: st, Alloc: alloc.New(st, alloc.Config{}), CA: ca, ServerCert: pair.Leaf}).Handler())
	t.Cleanup(srv.Close)
	b := &apiBundle{t: t, srv: srv, st: st, dsn: dsn}
	b.sql(`INSERT INTO nodes (name, region) VALUES ('c1', 'lab'), ('c2', 'lab')`)
	// c1 renewed (its newest certificate counts, not the older one); c2's only certificate
	// expires first; a revoked one and a retired node's do not count.
	b.sql(`INSERT INTO node_credentials (serial, node_id, not_after, revoked_at)
		SELECT 's1', id, '2031-01-01Z'::timestamptz, NULL::timestamptz FROM nodes WHERE name = 'c1' UNION ALL
		SELECT 's2', id, '2030-01-01Z', NULL FROM nodes WHERE name = 'c1' UNION ALL
		SELECT 's3', id, '2030-06-01Z', NULL FROM nodes WHERE name = 'c2' UNION ALL
		SELECT 's4', id, '2029-01-01Z', now() FROM nodes WHERE name = 'c2'`)
	m := b.scrape()
	for cert, want := range map[string]float64{
		"ca":     float64(ca.Cert.NotAfter.Unix()),
		"server": float64(pair.Leaf.NotAfter.Unix()),
		"node":   float64(time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC).Unix()),
	} {
		if got := m[`gpuaas_certificate_expiry_timestamp_seconds{cert="`+cert+`"}`]; got != want {
			t.Errorf("%s certificate expiry = %v, want %v", cert, got, want)
		}
	}
}
