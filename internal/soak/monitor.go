package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// monitor reads the controller's own /metrics (go_goroutines, process_resident_memory_bytes)
// over HTTPS, as Prometheus would.
type monitor struct {
	url string
	hc  *http.Client

	mu       sync.Mutex
	baseline *sample
	loadEnd  bool
	final    []sample // taken in the last part of the load
	max      sample
	n        int
}

type sample struct {
	goroutines int
	rss        float64 // bytes
}

func newMonitor(env *benchenv.Env) (*monitor, error) {
	tlsCfg, err := pki.ClientTLSConfig(env.CAFile)
	if err != nil {
		return nil, err
	}
	return &monitor{url: env.Server + "/metrics", hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}}, nil
}

// sample scrapes every two seconds until ctx ends. The first sample after warmup is the
// baseline; samples in the last fifth of the load are the final figures.
func (m *monitor) sample(ctx context.Context, warmup time.Duration) {
	start := time.Now()
	every(ctx, 2*time.Second, func() {
		s, err := m.scrape(ctx)
		if err != nil {
			return // counted as missing samples in the verdict
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.n++
		m.max.goroutines = max(m.max.goroutines, s.goroutines)
		m.max.rss = max(m.max.rss, s.rss)
		switch {
		case m.loadEnd:
		case m.baseline == nil && time.Since(start) >= warmup:
			m.baseline = &s
		case m.baseline != nil:
			m.final = append(m.final, s)
			if len(m.final) > 5 {
				m.final = m.final[1:]
			}
		}
	})
}

// endLoad freezes the final figures: what follows is the drain, not the load.
func (m *monitor) endLoad() {
	m.mu.Lock()
	m.loadEnd = true
	m.mu.Unlock()
}

func (m *monitor) scrape(ctx context.Context) (sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.url, nil)
	if err != nil {
		return sample{}, err
	}
	resp, err := m.hc.Do(req)
	if err != nil {
		return sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sample{}, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the two gauges from the Prometheus text format.
func parseMetrics(r io.Reader) (sample, error) {
	var s sample
	found := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || (name != "go_goroutines" && name != "process_resident_memory_bytes") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return s, fmt.Errorf("%s: %w", name, err)
		}
		if name == "go_goroutines" {
			s.goroutines = int(v)
		} else {
			s.rss = v
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	if found != 2 {
		return s, fmt.Errorf("/metrics lacks go_goroutines or process_resident_memory_bytes")
	}
	return s, nil
}

// result summarises: the final figures are the medians of the last samples under load.
func (m *monitor) result() Memory {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := Memory{MaxGoroutines: m.max.goroutines, MaxRSSMiB: m.max.rss / (1 << 20)}
	if m.baseline == nil || len(m.final) == 0 {
		return out // Samples stays 0: the verdict reports it
	}
	out.Samples = m.n
	out.BaselineGoroutines, out.BaselineRSSMiB = m.baseline.goroutines, m.baseline.rss/(1<<20)
	gs := make([]int, len(m.final))
	rs := make([]float64, len(m.final))
	for i, s := range m.final {
		gs[i], rs[i] = s.goroutines, s.rss
	}
	sort.Ints(gs)
	sort.Float64s(rs)
	out.FinalGoroutines, out.FinalRSSMiB = gs[len(gs)/2], rs[len(rs)/2]/(1<<20)
	return out
}
