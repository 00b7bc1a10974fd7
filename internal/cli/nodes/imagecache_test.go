package nodes

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/imagecache"
)

// `nodes show` lists the images a host's cache holds from the heartbeat's facts, marking
// the ones a slice uses; a host that reports no cache says so instead.
func TestShowListsTheHostImageCache(t *testing.T) {
	ents := []imagecache.Entry{
		{DigestSHA256: strings.Repeat("a", 64), SizeBytes: 1000, LastUsed: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Pinned: true},
		{DigestSHA256: strings.Repeat("b", 64), SizeBytes: 2000, LastUsed: time.Date(2026, 1, 3, 3, 4, 5, 0, time.UTC)},
	}
	facts, err := json.Marshal(map[string]any{"runtime": "lab", "facts": map[string]any{"image_cache": map[string]any{
		"budget_bytes": 4096, "used_bytes": 3000, "images": ents, "hits": 3, "downloads": 2, "evictions": 1}}})
	if err != nil {
		t.Fatal(err)
	}
	render := func(raw json.RawMessage) string {
		var b bytes.Buffer
		if err := output.Print(&b, output.Table, nil, func(tw *output.TableWriter) { printImageCache(tw, raw) }); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	got := render(facts)
	for _, want := range []string{"2 images, 3000 bytes (budget 4096 bytes); hits=3 downloads=2 evictions=1",
		"aaaaaaaaaaaaaaaa… 1000 bytes", "in use", "bbbbbbbbbbbbbbbb… 2000 bytes"} {
		if !strings.Contains(got, want) {
			t.Fatalf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Count(got, "in use") != 1 {
		t.Fatalf("only the pinned image is in use:\n%s", got)
	}
	if got := render(json.RawMessage(`{"runtime":"sim","facts":{}}`)); !strings.Contains(got, "not reported") {
		t.Fatalf("sim host: %s", got)
	}
}
