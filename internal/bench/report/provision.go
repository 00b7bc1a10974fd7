package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/bench/provision"
	"github.com/gpuaas/gpuaas/internal/task"
)

// provisionSuite is allocation commit -> first phase started on the host.
type provisionSuite struct {
	Result provision.Result `json:"result"`
	// Lab is the real slice VM's phase timings (lab runtime: libvirtd + QEMU, the test
	// guest), from the lab_vm script; LabNote says why there are none.
	Lab     []labPhase `json:"lab_phases,omitempty"`
	LabNote string     `json:"lab_note,omitempty"`
	// Warm is the disk side of a provision with and without a warm slot (a staged image).
	Warm *provision.WarmResult `json:"warm_slot,omitempty"`
}

type labPhase struct {
	Task    string  `json:"task"` // slice.vm_provision or slice.vm_release
	Phase   string  `json:"phase"`
	Status  string  `json:"status"`
	Seconds float64 `json:"seconds"`
	Attempt int     `json:"attempt"`
}

// labLine is a phase line as gpuaasctl prints it while waiting:
// "[  16.5s] slice.vm_provision #1 domain_define_start        ok     14.632s  detail".
var labLine = regexp.MustCompile(`(slice\.vm_(?:provision|release)) #(\d+) (\S+)\s+(ok|skipped|failed)\s+(\S+)`)

// runLab boots the lab VM through the lab_vm script (real libvirtd + QEMU, the project's
// test guest; root only) and returns its phase timings, or why it could not run.
func runLab(ctx context.Context) ([]labPhase, string) {
	ctx, cancel := context.WithTimeout(ctx, 12*time.Minute)
	defer cancel()
	fmt.Println("provision: booting the lab VM (lab_vm script; needs root and libvirtd)...")
	out, err := exec.CommandContext(ctx, "go", "test", "-count=1", "-v", "-run", "^TestScripts$/^lab_vm$", "./internal/e2e").CombinedOutput()
	var phases []labPhase
	for _, line := range strings.Split(string(out), "\n") {
		m := labLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		d, derr := time.ParseDuration(m[5])
		if derr != nil {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		phases = append(phases, labPhase{Task: m[1], Attempt: n, Phase: m[3], Status: m[4], Seconds: d.Seconds()})
	}
	switch {
	case len(phases) > 0 && err == nil:
		return phases, ""
	case strings.Contains(string(out), "SKIP"):
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "skip") && strings.Contains(line, "lab") {
				return nil, "lab not available here: " + strings.TrimSpace(line)
			}
		}
		return nil, "lab not available here (the lab_vm script skipped)"
	case err != nil:
		return phases, fmt.Sprintf("the lab_vm script failed (%v); phases seen: %d", err, len(phases))
	}
	return nil, "the lab_vm script printed no phase timings"
}

func runProvision(ctx context.Context, work, bin string, quick bool) (*provisionSuite, error) {
	hosts, allocs := 13, 100 // 104 slots: every allocation fits at once
	if quick {
		hosts, allocs = 4, 30
	}
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: filepath.Join(work, "provision"), BinDir: bin})
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	fmt.Printf("provision: enrolling %d sim hosts (discover + approve each)...\n", hosts)
	fleet, err := provision.Start(ctx, env, bin, hosts)
	if err != nil {
		return nil, err
	}
	defer fleet.Stop()
	// Warm up as the API suite does: one allocation per host, provisioned and released, so
	// the burst meets a controller whose connections and plan caches have served before.
	if _, err := fleet.Burst(ctx, hosts); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	r, err := fleet.Burst(ctx, allocs)
	if err != nil {
		return nil, err
	}
	fmt.Printf("provision: %d allocations on %d hosts: queued p50 %.0f ms p99 %.0f ms; first phase p50 %.0f ms p99 %.0f ms max %.0f ms; active p50 %.0f ms p99 %.0f ms; failed %d\n",
		r.Allocations, r.Hosts, r.QueuedP50ms, r.QueuedP99ms, r.FirstPhaseP50ms, r.FirstPhaseP99ms, r.FirstPhaseMaxms, r.ActiveP50ms, r.ActiveP99ms, r.Failed)
	ps := &provisionSuite{Result: r}
	if quick {
		ps.LabNote = "not run in --quick"
	} else {
		ps.Lab, ps.LabNote = runLab(ctx)
		if ps.Warm, err = runWarm(ctx, work); err != nil {
			return nil, err
		}
	}
	return ps, nil
}

// warmImageGiB is the warm-slot comparison's image: several GiB of data, as a real OS image
// with its drivers and libraries is.
const warmImageGiB = 4

// runWarm measures the disk phases with and without a warm slot (provision.MeasureWarm); the
// data image is generated once into the user's cache directory and reused.
func runWarm(ctx context.Context, work string) (*provision.WarmResult, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	fmt.Printf("provision: warm slot vs cold disk write, %d GiB data image...\n", warmImageGiB)
	r, err := provision.MeasureWarm(ctx, filepath.Join(cache, "gpuaas-bench"), work, warmImageGiB)
	if err != nil {
		return nil, fmt.Errorf("warm slot: %w", err)
	}
	return &r, nil
}

// warmMarkdown is the warm-slot section: the disk phases of one provision, cold and warm.
func warmMarkdown(b *strings.Builder, w *provision.WarmResult) {
	b.WriteString("\n### Warm slots: the disk phases with and without a staged image\n\n")
	if w.Note != "" {
		fmt.Fprintf(b, "%s.\n", w.Note)
		return
	}
	fmt.Fprintf(b, "A %.1f GiB raw data image (random bytes, no holes), cached on the host, onto a loop device standing in for the slot's NVMe, with the lab runtime's commands (%s). Cold: a provision onto a wiped disk (the image is written). Warm: the same provision once the image was staged on that disk after its wipe proof (the write is skipped). Staging runs while the slot is idle, off the provision's path.\n\n", float64(w.ImageBytes)/(1<<30), w.CPU)
	b.WriteString("| run | phase | status | seconds |\n|---|---|---|---|\n")
	for _, run := range []struct {
		name   string
		phases []task.Phase
	}{{"cold provision", w.Cold}, {"staging (idle slot)", w.Stage}, {"warm provision", w.Warm}} {
		total := 0.0
		for _, p := range run.phases {
			fmt.Fprintf(b, "| %s | %s | %s | %.3f |\n", run.name, p.Name, p.Status, float64(p.DurationMS)/1000)
			total += float64(p.DurationMS) / 1000
		}
		fmt.Fprintf(b, "| %s | **total** | | **%.3f** |\n", run.name, total)
	}
	fmt.Fprintf(b, "\nCached files hashed again in each run: %v (hash-once: an unchanged cached image is not read again).\n", w.Hashes)
}

func (s *provisionSuite) markdown() string {
	r := s.Result
	var b strings.Builder
	fmt.Fprintf(&b, "## Provisioning overhead (item 5)\n\n%d one-GPU allocations created at the same instant (one HTTPS client each) on %d enrolled `gpuaas-hostd` processes (sim runtime: the VM is simulated, %d ms per phase; enrollment, mTLS long polls, signed tasks, progress and results are real). Each client has connected (TLS handshake) before the burst, and a warm-up burst of one allocation per host has been provisioned and released first (as the API suite warms up). Measured from the allocation's commit (its `created_at`: the clock at the allocation's insert, the last statement before commit) to the start of the first of the 17 phases recorded by the host, both on this machine's clock; task queued is the provisioning task's creation, in the create transaction itself (so it is before the commit: negative).\n\n", r.Allocations, r.Hosts, r.SimPhaseDelayMS)
	b.WriteString("| allocations | hosts | commit→task queued p50 ms | p99 ms | commit→first phase p50 ms | p99 ms | max ms | commit→active p50 ms | p99 ms | failed | released after |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d |\n\n", r.Allocations, r.Hosts, r.QueuedP50ms, r.QueuedP99ms, r.FirstPhaseP50ms, r.FirstPhaseP99ms, r.FirstPhaseMaxms, r.ActiveP50ms, r.ActiveP99ms, r.Failed, r.ReleasedVerified)
	fmt.Fprintf(&b, "- target: commit→first phase p99 <= 1 s: %s.\n", verdict(r.FirstPhaseP99ms > 0 && r.FirstPhaseP99ms <= 1000 && r.Failed == 0))
	b.WriteString("- commit→active includes the 17 simulated phases; a host runs up to 8 tasks at once.\n")
	b.WriteString("\n### The lab VM's phase timings\n\nA real slice VM on the lab runtime (libvirtd + QEMU in software emulation, UEFI boot of the project's test guest from a loop device standing in for the NVMe, DHCP from hostd, readiness over SSH; GPU/VF passthrough phases are skipped: no such hardware), from the `lab_vm` script. Emulated boot dominates, not the control plane.\n\n")
	if len(s.Lab) == 0 {
		fmt.Fprintf(&b, "%s.\n", s.LabNote)
		if s.Warm != nil {
			warmMarkdown(&b, s.Warm)
		}
		return b.String()
	}
	if s.LabNote != "" {
		fmt.Fprintf(&b, "%s.\n\n", s.LabNote)
	}
	b.WriteString("| task | attempt | phase | status | seconds |\n|---|---|---|---|---|\n")
	for _, p := range s.Lab {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %.3f |\n", p.Task, p.Attempt, p.Phase, p.Status, p.Seconds)
	}
	if s.Warm != nil {
		warmMarkdown(&b, s.Warm)
	}
	return b.String()
}
