package api_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
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

	m := b.scrape()
	want := map[string]float64{
		`gpuaas_database_up`:                                                    1,
		`gpuaas_nodes{status="active"}`:                                         1,
		`gpuaas_nodes_heartbeat_stale`:                                          1, // n1 never sent a heartbeat
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
