package tasks

import (
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func TestWaterfall(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ph := []apiv1.TaskPhase{
		{Name: "a", StartedAt: t0, DurationMS: 1000},
		{Name: "b", StartedAt: t0.Add(time.Second), DurationMS: 0},
		{Name: "c", StartedAt: t0.Add(time.Second), DurationMS: 3000},
	}
	got := Waterfall(ph, 8)
	want := []string{"██", "  ▏", "  ██████"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("bar %d = %q, want %q (all %q)", i, got[i], want[i], got)
		}
	}
	if w := Waterfall(nil, 8); len(w) != 0 {
		t.Fatal(w)
	}
	if w := Waterfall([]apiv1.TaskPhase{{StartedAt: t0}}, 8); w[0] != "▏" {
		t.Fatalf("zero span %q", w)
	}
}
