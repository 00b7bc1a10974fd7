package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func TestAllocCreateAndReleaseWait(t *testing.T) {
	t.Parallel()
	provision := apiv1.AllocationTask{ID: "task-prov", Type: "slice.vm_provision", Attempt: 1, Status: "running",
		Phases: []apiv1.TaskPhase{{Name: "lease_acquire", Status: "ok", DurationMS: 100}}}
	a := sampleAlloc()
	a.Status, a.Tasks = "requested", nil
	var gets atomic.Int32
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"POST /api/v1/allocations": reply(201, a),
		"GET /api/v1/allocations/" + a.ID: func(w http.ResponseWriter, r *http.Request) {
			cur := a
			if gets.Add(1) == 1 {
				cur.Status, cur.Tasks = "provisioning", []apiv1.AllocationTask{provision}
			} else {
				done := provision
				done.Status = "succeeded"
				done.Phases = append(done.Phases, apiv1.TaskPhase{Name: "readiness", Status: "ok", DurationMS: 2000})
				cur.Status, cur.Tasks = "active", []apiv1.AllocationTask{done}
			}
			reply(200, cur)(w, r)
		},
	})
	r := run(t, fa.env(t), "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "--wait", "-o", "json")
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.ErrOut)
	}
	var got apiv1.Allocation
	if err := json.Unmarshal([]byte(r.Out), &got); err != nil || got.Status != "active" {
		t.Fatalf("stdout must be the final allocation as JSON: %q", r.Out)
	}
	if strings.Count(r.ErrOut, "lease_acquire") != 1 || !strings.Contains(r.ErrOut, "slice.vm_provision #1 readiness") {
		t.Fatalf("each phase once, on stderr: %q", r.ErrOut)
	}

	// Release: phases the release answer already carries are not repeated; a failure is exit 1.
	rel := a
	rel.Status, rel.Tasks = "releasing", []apiv1.AllocationTask{provision}
	failed := rel
	failed.Status, failed.FailureReason = "failed", "wipe_verify: device busy"
	failed.Tasks = append(failed.Tasks, apiv1.AllocationTask{ID: "task-rel", Type: "slice.vm_release", Attempt: 1,
		Phases: []apiv1.TaskPhase{{Name: "wipe_verify", Status: "error", Error: "device busy"}}})
	fa = newFakeAPI(t, map[string]http.HandlerFunc{
		"POST /api/v1/allocations/" + a.ID + "/release": reply(200, rel),
		"GET /api/v1/allocations/" + a.ID:               reply(200, failed),
	})
	r = run(t, fa.env(t), "alloc", "release", a.ID, "--wait", "--yes")
	if r.Code != 1 || !strings.Contains(r.ErrOut, "error: allocation "+a.ID+" failed: wipe_verify: device busy") {
		t.Fatalf("failed release: %d %q", r.Code, r.ErrOut)
	}
	if strings.Contains(r.ErrOut, "lease_acquire") || !strings.Contains(r.ErrOut, "slice.vm_release #1 wipe_verify") {
		t.Fatalf("only new phases: %q", r.ErrOut)
	}
}

func TestWaitShowsRunningProgressAndSkipReasons(t *testing.T) {
	t.Parallel()
	a := sampleAlloc()
	a.Status, a.Tasks = "requested", nil
	step := func(phases ...apiv1.TaskPhase) apiv1.AllocationTask {
		return apiv1.AllocationTask{ID: "task-prov", Type: "slice.vm_provision", Attempt: 1, Status: "running", Phases: phases}
	}
	skip := apiv1.TaskPhase{Name: "vfio_bind_check", Status: "skipped", Detail: "lab host: no PCI passthrough"}
	dl := func(d string) apiv1.TaskPhase {
		return apiv1.TaskPhase{Name: "image_stat_download", Status: "running", Detail: d}
	}
	answers := []apiv1.AllocationTask{
		step(skip, dl("10 of 100 MiB (10%)")),
		step(skip, dl("10 of 100 MiB (10%)")), // same progress: not repeated
		step(skip, dl("60 of 100 MiB (60%)")),
		step(skip, apiv1.TaskPhase{Name: "image_stat_download", Status: "ok", DurationMS: 3000, Detail: "downloaded"}),
	}
	var gets atomic.Int32
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"POST /api/v1/allocations": reply(201, a),
		"GET /api/v1/allocations/" + a.ID: func(w http.ResponseWriter, r *http.Request) {
			i := int(gets.Add(1)) - 1
			cur := a
			cur.Status = "provisioning"
			if i >= len(answers)-1 {
				i, cur.Status = len(answers)-1, "active"
			}
			cur.Tasks = []apiv1.AllocationTask{answers[i]}
			reply(200, cur)(w, r)
		},
	})
	r := run(t, fa.env(t), "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "--wait")
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.ErrOut)
	}
	if !strings.Contains(r.ErrOut, "vfio_bind_check            skipped 0s  lab host: no PCI passthrough") {
		t.Errorf("skip reason missing: %q", r.ErrOut)
	}
	if strings.Count(r.ErrOut, "running 10 of 100 MiB (10%)") != 1 || strings.Count(r.ErrOut, "running 60 of 100 MiB (60%)") != 1 {
		t.Errorf("each distinct progress once: %q", r.ErrOut)
	}
	if strings.Count(r.ErrOut, "image_stat_download        ok") != 1 {
		t.Errorf("finished phase once: %q", r.ErrOut)
	}
}

func TestTasksLogsFollow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	ph := []apiv1.TaskPhase{
		{Name: "lease_acquire", Status: "ok", StartedAt: t0, DurationMS: 5},
		{Name: "image_stat_download", Status: "running", StartedAt: t0, Detail: "5 MiB"},
	}
	var gets atomic.Int32
	fa := newFakeAPI(t, map[string]http.HandlerFunc{
		"GET /api/v1/tasks/01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f50": func(w http.ResponseWriter, r *http.Request) {
			tk := apiv1.Task{ID: "01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f50", Type: "slice.vm_provision", Status: "leased", Phases: ph}
			if gets.Add(1) > 1 {
				tk.Status = "succeeded"
				tk.Phases = []apiv1.TaskPhase{ph[0], {Name: "image_stat_download", Status: "ok", StartedAt: t0, DurationMS: 2000, Detail: "downloaded"},
					{Name: "vfio_bind_check", Status: "skipped", StartedAt: t0, Detail: "lab host"}}
			}
			reply(200, tk)(w, r)
		},
	})
	r := run(t, fa.env(t), "tasks", "logs", "01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f50", "--follow")
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.ErrOut)
	}
	lines := strings.Split(strings.TrimSpace(r.Out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "lease_acquire") || !strings.Contains(lines[1], "image_stat_download") ||
		!strings.Contains(lines[1], "downloaded") || !strings.Contains(lines[2], "lab host") || strings.Contains(r.Out, "running") {
		t.Fatalf("each finished phase once, in order: %q", r.Out)
	}
	if !strings.Contains(r.ErrOut, "succeeded") {
		t.Fatalf("end status: %q", r.ErrOut)
	}
}
