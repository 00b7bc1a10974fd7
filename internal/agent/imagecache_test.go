package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpuaas/internal/imagecache"
)

// The image cache's hits, downloads and evictions reach /metrics, and the heartbeat's facts
// list what the cache holds with the same totals (what gpuaasctl nodes show prints).
func TestImageCacheMetricsAndFacts(t *testing.T) {
	dir := t.TempDir()
	c := &imagecache.Cache{Dir: filepath.Join(dir, "slice-images"), BudgetBytes: 1000}
	var digests []string
	for _, name := range []string{"a", "b"} {
		b := []byte(strings.Repeat(name, 1000))
		p := filepath.Join(dir, name+".qcow2")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		d := hex.EncodeToString(sum[:])
		digests = append(digests, d)
		for i := 0; i < 2; i++ { // a download, then a hit
			if _, _, err := c.Get(context.Background(), "file://"+p, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	m := &metrics{reg: prometheus.NewRegistry()}
	m.registerImageCache(c)
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			if mt.GetCounter() != nil {
				got[f.GetName()] = mt.GetCounter().GetValue()
			} else if mt.GetGauge() != nil {
				got[f.GetName()] = mt.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{"gpuaas_hostd_image_cache_hits_total": 2, "gpuaas_hostd_image_cache_downloads_total": 2,
		"gpuaas_hostd_image_cache_evictions_total": 1, "gpuaas_hostd_image_cache_evicted_bytes_total": 1000,
		"gpuaas_hostd_image_cache_bytes": 1000, "gpuaas_hostd_image_cache_budget_bytes": 1000,
		"gpuaas_hostd_image_cache_rehashes_total": 0} // each hit found its file unchanged since its download
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	b, err := json.Marshal(Facts{ImageCache: imageCacheFacts(c)})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"budget_bytes":1000`, `"used_bytes":1000`, `"hits":2`, `"evictions":1`, `"digest_sha256":"` + digests[1] + `"`} {
		if !strings.Contains(string(b), s) {
			t.Errorf("facts lack %s: %s", s, b)
		}
	}
}
