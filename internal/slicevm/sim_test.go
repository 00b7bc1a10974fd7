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
		if len(got) != tc.hold+1 || got[tc.hold].Name != phases[tc.hold] || got[tc.hold].Status == "ok" {
			t.Fatalf("%s phases %+v: want %d finished and %s not ok", tc.typ, got, tc.hold, phases[tc.hold])
		}
		for _, p := range got[:tc.hold] {
			if p.Status != "ok" {
				t.Fatalf("%s phase %s %s before the hold", tc.typ, p.Name, p.Status)
			}
		}
	}
}
