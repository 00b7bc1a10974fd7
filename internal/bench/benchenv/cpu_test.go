package benchenv

import (
	"testing"
	"time"
)

func TestProcStatCPU(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	busy, idle, err := ProcStatCPU("cpu  100 2 30 500 7 1 4 9 0 0\ncpu0 50 1 15 250 3 0 2 4 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if busy != 137*clockTick || idle != 507*clockTick {
		t.Fatalf("busy %v idle %v, want %v and %v (steal in neither)", busy, idle, 137*clockTick, 507*clockTick)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu 1 2 x 4 5 6 7 8"} {
		if _, _, err := ProcStatCPU(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if busy, idle, err := MachineCPU(); err != nil || busy+idle <= 0 || busy+idle > 1e6*time.Hour {
		t.Fatalf("this machine: busy %v idle %v, %v", busy, idle, err)
	}
}

func TestStatCPU(t *testing.T) {
	// Field 2 holds spaces and a parenthesis; utime stime cutime cstime are fields 14-17.
	line := "42 (post gres) x) S 1 42 42 0 -1 4194560 10 0 0 0 7 3 20 5 20 0 1 0 100 0 0"
	self, reaped, err := StatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if self != 10*clockTick || reaped != 25*clockTick {
		t.Fatalf("self %v reaped %v, want %v and %v", self, reaped, 10*clockTick, 25*clockTick)
	}
}

func TestMetricValue(t *testing.T) {
	exp := []byte("# HELP gpuaas_placement_windows_total x\n# TYPE gpuaas_placement_windows_total counter\ngpuaas_placement_windows_total 1234\ngpuaas_placement_windows_total_other 9\ngpuaas_api_requests_total{route=\"x\",code=\"200\"} 5\n")
	if v, err := metricValue(exp, "gpuaas_placement_windows_total"); err != nil || v != 1234 {
		t.Fatalf("windows = %v, %v; want 1234", v, err)
	}
	if _, err := metricValue(exp, "gpuaas_placement_fleet_scans_total"); err == nil {
		t.Fatal("a missing metric read as a value")
	}
}
