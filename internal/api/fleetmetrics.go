package api

import (
	"context"
	"crypto/x509"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpuaas/internal/store"
)

// fleetCollector reports the fleet's state from PostgreSQL at scrape time: what the alerting
// rules in deploy/prometheus watch (nodes missing heartbeats, stuck and failing tasks, slow
// provisioning, blocked cleanups, wipe failures, capacity per SKU, certificate expiry). The
// figures come from the database, so every replica reports the same ones (the rules take
// their max); a reading is reused for cacheFor, so several scrapers cost one query set.
type fleetCollector struct {
	store      *store.Store
	staleAfter time.Duration
	certs      map[string]*x509.Certificate // the controller's own certificates by role
	cacheFor   time.Duration

	mu    sync.Mutex
	at    time.Time
	stats store.FleetStats
	dbErr error
}

var (
	descDBUp          = prometheus.NewDesc("gpuaas_database_up", "1 when this replica's database answers (what /readyz checks), 0 otherwise.", nil, nil)
	descNodes         = prometheus.NewDesc("gpuaas_nodes", "Nodes by status.", []string{"status"}, nil)
	descNodesStale    = prometheus.NewDesc("gpuaas_nodes_heartbeat_stale", "Active nodes whose last heartbeat is older than --heartbeat-max-age (nodes never heard from, not enrolled yet, are not counted).", nil, nil)
	descSlots         = prometheus.NewDesc("gpuaas_slots", "Resource slots by status.", []string{"status"}, nil)
	descAllocs        = prometheus.NewDesc("gpuaas_allocations", "Live allocations by status.", []string{"status"}, nil)
	descOldestInFl    = prometheus.NewDesc("gpuaas_allocations_provisioning_oldest_seconds", "Age of the oldest allocation still requested or provisioning (0: none).", nil, nil)
	descProvision     = prometheus.NewDesc("gpuaas_provisioning_recent_seconds", "Create-to-active time of allocations created in the last 15 minutes, by quantile (absent: none active yet).", []string{"quantile"}, nil)
	descProvisionN    = prometheus.NewDesc("gpuaas_provisioning_recent_count", "Allocations created in the last 15 minutes that became active.", nil, nil)
	descTasksPending  = prometheus.NewDesc("gpuaas_tasks_pending", "Host tasks queued or leased.", []string{"status"}, nil)
	descOldestTask    = prometheus.NewDesc("gpuaas_tasks_pending_oldest_seconds", "Age of the oldest queued or leased host task (0: none).", nil, nil)
	descTasksFailed   = prometheus.NewDesc("gpuaas_tasks_failed_recent", "Host tasks that ended failed, refused or expired in the last 15 minutes, by type and status.", []string{"type", "status"}, nil)
	descWipeFailures  = prometheus.NewDesc("gpuaas_wipe_failures_recent", "Unverified wipe proofs (failed wipes) recorded in the last 15 minutes.", nil, nil)
	descSKUTotal      = prometheus.NewDesc("gpuaas_sku_gpus", "GPUs of a SKU on sellable nodes (active, not draining).", []string{"sku"}, nil)
	descSKUFree       = prometheus.NewDesc("gpuaas_sku_gpus_free", "GPUs of a SKU free for sale now.", []string{"sku"}, nil)
	descCertExpiry    = prometheus.NewDesc("gpuaas_certificate_expiry_timestamp_seconds", "Expiry (Unix time) of the controller's certificates by role; node is the earliest of the active nodes' newest certificates.", []string{"cert"}, nil)
	fleetCollectorAll = []*prometheus.Desc{descDBUp, descNodes, descNodesStale, descSlots, descAllocs, descOldestInFl, descProvision, descProvisionN,
		descTasksPending, descOldestTask, descTasksFailed, descWipeFailures, descSKUTotal, descSKUFree, descCertExpiry}
)

// Describe implements prometheus.Collector.
func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range fleetCollectorAll {
		ch <- d
	}
}

func (c *fleetCollector) read() (store.FleetStats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.cacheFor {
		return c.stats, c.dbErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.stats, c.dbErr = c.store.FleetStats(ctx, c.staleAfter)
	c.at = time.Now()
	return c.stats, c.dbErr
}

// Collect implements prometheus.Collector. Without the database only gpuaas_database_up (0)
// and the certificates are reported: a missing series is not a zero.
func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for role, cert := range c.certs {
		if cert != nil {
			gauge(descCertExpiry, float64(cert.NotAfter.Unix()), role)
		}
	}
	st, err := c.read()
	if err != nil {
		gauge(descDBUp, 0)
		return
	}
	gauge(descDBUp, 1)
	for _, s := range []string{"pending", "active", "unavailable", "retired"} {
		gauge(descNodes, float64(st.Nodes[s]), s)
	}
	gauge(descNodesStale, float64(st.NodesStale))
	for _, s := range []string{"available", "reserved", "provisioning", "active", "releasing", "cleanup", "cleanup_blocked", "failed", "disabled"} {
		gauge(descSlots, float64(st.Slots[s]), s)
	}
	for _, s := range []string{"requested", "provisioning", "active", "releasing"} {
		gauge(descAllocs, float64(st.Allocations[s]), s)
	}
	gauge(descOldestInFl, st.OldestInFlight.Seconds())
	gauge(descProvisionN, float64(len(st.RecentProvision)))
	if len(st.RecentProvision) > 0 {
		sorted := slices.Clone(st.RecentProvision)
		slices.Sort(sorted)
		for _, q := range []float64{0.5, 0.95, 1} {
			gauge(descProvision, sorted[int(q*float64(len(sorted)-1))], strconv.FormatFloat(q, 'f', -1, 64))
		}
	}
	for _, s := range []string{"queued", "leased"} {
		gauge(descTasksPending, float64(st.TasksPending[s]), s)
	}
	gauge(descOldestTask, st.OldestPending.Seconds())
	for k, n := range st.TasksFailed {
		gauge(descTasksFailed, float64(n), k[0], k[1])
	}
	gauge(descWipeFailures, float64(st.WipeFailures))
	for sku, capa := range st.SKUs {
		gauge(descSKUTotal, float64(capa.Total), sku)
		gauge(descSKUFree, float64(capa.Free), sku)
	}
	if !st.NodeCertEarliest.IsZero() {
		gauge(descCertExpiry, float64(st.NodeCertEarliest.Unix()), "node")
	}
}
