package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuaas/gpuaas/internal/imagecache"
)

type metrics struct {
	reg        *prometheus.Registry
	tasks      *prometheus.CounterVec
	refusals   *prometheus.CounterVec
	pollErrors prometheus.Counter
	spooled    prometheus.GaugeFunc
	running    prometheus.GaugeFunc
	duration   *prometheus.HistogramVec
}

func newMetrics(a *Agent) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.tasks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuaas_hostd_tasks_total", Help: "Tasks run, by type and final status."}, []string{"type", "status"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuaas_hostd_task_refusals_total", Help: "Tasks refused before running, by reason."}, []string{"reason"})
	m.pollErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuaas_hostd_poll_errors_total", Help: "Failed long polls (controller unreachable or refusing)."})
	m.spooled = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuaas_hostd_spooled_results", Help: "Results waiting in the spool for acknowledgement."}, func() float64 {
		p, _ := a.spool.Pending()
		return float64(len(p))
	})
	m.running = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuaas_hostd_running_tasks", Help: "Tasks running now."}, func() float64 { return float64(a.running.Load()) })
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gpuaas_hostd_task_seconds", Help: "Task run time by type.",
		Buckets: prometheus.ExponentialBuckets(0.01, 3, 10)}, []string{"type"})
	m.reg.MustRegister(m.tasks, m.refusals, m.pollErrors, m.spooled, m.running, m.duration,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerImageCache adds the slice image cache's counters (VM runtimes only).
func (m *metrics) registerImageCache(c *imagecache.Cache) {
	counter := func(name, help string, v func(imagecache.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(c.Stats())) })
	}
	m.reg.MustRegister(
		counter("gpuaas_hostd_image_cache_hits_total", "Provisions that found their image in the host cache.", func(s imagecache.Stats) int64 { return s.Hits }),
		counter("gpuaas_hostd_image_cache_downloads_total", "Images downloaded into the host cache.", func(s imagecache.Stats) int64 { return s.Downloads }),
		counter("gpuaas_hostd_image_cache_evictions_total", "Images evicted to keep the cache within its budget.", func(s imagecache.Stats) int64 { return s.Evictions }),
		counter("gpuaas_hostd_image_cache_evicted_bytes_total", "Bytes evicted from the image cache.", func(s imagecache.Stats) int64 { return s.EvictedBytes }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gpuaas_hostd_image_cache_rehashes_total",
			Help: "Cached images read again to re-verify their digest (their stamp changed since they were last hashed)."},
			func() float64 { return float64(c.Hashes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuaas_hostd_image_cache_bytes", Help: "Bytes the image cache holds."}, func() float64 {
			ents, _ := c.Entries()
			var n int64
			for _, e := range ents {
				n += e.SizeBytes
			}
			return float64(n)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuaas_hostd_image_cache_budget_bytes", Help: "The image cache's budget (0: unbounded)."},
			func() float64 { return float64(c.BudgetBytes) }))
}

// serveMetrics serves /metrics on addr until ctx ends (a local port; the host dials out only).
func (a *Agent) serveMetrics(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics server", "err", err)
		}
	}()
	a.metricsAddr.Store(ln.Addr().String())
	a.log.Info("metrics listening", "addr", ln.Addr().String())
	return nil
}
