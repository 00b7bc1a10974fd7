package slicevm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
)

// A held phase is entered (reported running as held, every earlier phase finished) and
// never finishes until the task's context ends; nothing after it runs.
func TestSimHoldStaysInThePhase(t *testing.T) {
	for _, tc := range []struct {
		typ  string
		run  func(Sim, context.Context, *Recorder) error
		hold int
	}{
		{string(task.TypeVMProvision), func(s Sim, ctx context.Context, r *Recorder) error {
			_, err := s.Provision(ctx, &task.VMProvision{AllocationID: "a1",
				Bundles: []task.Bundle{{SlotID: "s1", GPUPCI: "0000:1b:00.0", FabricVFPCI: "0000:1a:00.2", NVMeDevice: "/dev/disk/by-id/nvme-a"}},
				Image:   task.Image{Slug: "img", DigestSHA256: strings.Repeat("a", 64)}}, r)
			return err
		}, 12},
		{string(task.TypeVMRelease), func(s Sim, ctx context.Context, r *Recorder) error {
			_, err := s.Release(ctx, &task.VMRelease{AllocationID: "a1"}, r)
			return err
		}, 5},
	} {
		phases := task.PhasesOf(tc.typ)
		held := make(chan []task.Phase, 100)
		rec := &Recorder{OnUpdate: func(p []task.Phase) { held <- p }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tc.run(Sim{Hold: phases[tc.hold]}, ctx, rec) }()
		deadline := time.After(time.Minute)
	wait:
		for {
			select {
			case p := <-held:
				if len(p) == tc.hold+1 && p[tc.hold].Status == "running" && strings.HasPrefix(p[tc.hold].Detail, "held") {
					break wait
				}
			case err := <-done:
				cancel()
				t.Fatalf("%s returned (%v) without holding %s: %+v", tc.typ, err, phases[tc.hold], rec.Phases())
			case <-deadline:
				cancel()
				t.Fatalf("%s never reached %s", tc.typ, phases[tc.hold])
			}
		}
		select {
		case err := <-done:
			t.Fatalf("%s finished while held: %v", tc.typ, err)
		default:
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("%s after cancel: %v, want context.Canceled", tc.typ, err)
		}
		got := rec.Phases()
		if len(got) != tc.hold+1 || got[tc.hold].Name != phases[tc.hold] || got[tc.hold].Status != "failed" {
			t.Fatalf("%s phases %+v: want %d finished and %s failed", tc.typ, got, tc.hold, phases[tc.hold])
		}
		for _, p := range got[:tc.hold] {
			if p.Status != PhaseSimulated {
				t.Fatalf("%s phase %s %s before the hold", tc.typ, p.Name, p.Status)
			}
		}
	}
}

// The sim runtime never reports a phase "ok": every phase it walks, provisioning and release,
// says simulated, and its wipe proofs say simulated too.
func TestSimPhasesSaySimulated(t *testing.T) {
	ctx := context.Background()
	bundles := []task.Bundle{{SlotID: "s1", GPUPCI: "0000:1b:00.0", FabricVFPCI: "0000:1a:00.2", NVMeDevice: "/dev/disk/by-id/nvme-a"}}
	rec := &Recorder{}
	out, err := Sim{}.Provision(ctx, &task.VMProvision{AllocationID: "a1", Bundles: bundles,
		Image: task.Image{Slug: "img", DigestSHA256: strings.Repeat("a", 64)}}, rec)
	if err != nil || !out.Simulated {
		t.Fatalf("provision: %+v, %v", out, err)
	}
	rel := &Recorder{}
	rout, err := Sim{}.Release(ctx, &task.VMRelease{AllocationID: "a1", Bundles: bundles, Wipe: true}, rel)
	if err != nil || !rout.Simulated || rout.Wiped["s1"].Method != "simulated" {
		t.Fatalf("release: %+v, %v", rout, err)
	}
	phases := append(rec.Phases(), rel.Phases()...)
	if len(phases) != len(ProvisionPhases)+len(ReleasePhases) {
		t.Fatalf("%d phases, want %d", len(phases), len(ProvisionPhases)+len(ReleasePhases))
	}
	for _, p := range phases {
		if p.Status != PhaseSimulated {
			t.Errorf("phase %s is %q, want %q", p.Name, p.Status, PhaseSimulated)
		}
	}
}

// The sim runtime's staging writes nothing and says so: its output and its one phase are
// simulated (the controller records it only when it allows simulated hosts).
func TestSimStagingSaysSimulated(t *testing.T) {
	rec := &Recorder{}
	out, err := Sim{}.Stage(context.Background(), &task.ImageStage{SlotID: "s1", Device: "/dev/disk/by-id/nvme-a",
		Image: task.Image{Slug: "img", DigestSHA256: strings.Repeat("a", 64)}}, rec)
	if err != nil || !out.Simulated || out.SlotID != "s1" {
		t.Fatalf("stage: %+v, %v", out, err)
	}
	if ph := rec.Phases(); len(ph) != 1 || ph[0].Name != "image_write_convert" || ph[0].Status != PhaseSimulated {
		t.Fatalf("phases %+v, want image_write_convert simulated", ph)
	}
	if _, err := (Sim{}).Stage(context.Background(), &task.ImageStage{SlotID: "s1", Image: task.Image{Slug: "img"}}, &Recorder{}); err == nil {
		t.Fatal("a staging without a digest was accepted")
	}
}
