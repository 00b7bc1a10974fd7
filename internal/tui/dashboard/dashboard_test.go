package dashboard

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/exp/teatest"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func numa(n int) *int { return &n }

// fleet is two nodes; h200-01 has slots 0-3 on NUMA 0 and 4-7 on NUMA 1 in mixed states.
type fleet struct {
	mu    sync.Mutex
	asked []string
}

func (f *fleet) fetch(_ context.Context, node string) (Snapshot, error) {
	f.mu.Lock()
	f.asked = append(f.asked, node)
	f.mu.Unlock()
	hb := t0.Add(-3 * time.Second)
	nodes := []apiv1.Node{
		{ID: "n2", Name: "h200-02", Region: "lab", Mode: "slice_supported", Status: "active", LastHeartbeatAt: &hb,
			SlotSummary: apiv1.SlotSummary{Total: 8, ByStatus: map[string]int{"available": 8}}},
		{ID: "n1", Name: "h200-01", Region: "lab", Mode: "slice_supported", Status: "active", LastHeartbeatAt: &hb,
			SlotSummary: apiv1.SlotSummary{Total: 8, ByStatus: map[string]int{"available": 4, "active": 2, "releasing": 1, "cleanup_blocked": 1}}},
	}
	var slots []apiv1.Slot
	if node == "" || node == "h200-01" {
		st := []string{"active", "active", "available", "releasing", "available", "available", "cleanup_blocked", "available"}
		health := map[int]string{5: "quarantined", 7: "degraded"}
		for i, s := range st {
			slots = append(slots, apiv1.Slot{SlotIndex: i, Status: s, NUMANode: numa(i / 4), Health: health[i]})
		}
	} else {
		for i := 0; i < 8; i++ {
			slots = append(slots, apiv1.Slot{SlotIndex: i, Status: "available", NUMANode: numa(i / 4)})
		}
	}
	tasks := []apiv1.Task{{ID: "7a1b2c3d-task", NodeID: "n1", Type: "slice.vm_release", Status: "leased", Attempt: 1,
		Phases: []apiv1.TaskPhase{{Name: "shutdown", Status: "ok"}}}}
	return Snapshot{Nodes: nodes, Slots: slots, Tasks: tasks, At: t0}, nil
}

func waitFor(t *testing.T, tm *teatest.TestModel, s string) {
	t.Helper()
	teatest.WaitFor(t, tm.Output(), func(b []byte) bool { return bytes.Contains(b, []byte(s)) },
		teatest.WithDuration(5*time.Second), teatest.WithCheckInterval(10*time.Millisecond))
}

func TestDashboardNavigatesAndShowsTheSelectedNode(t *testing.T) {
	f := &fleet{}
	tm := teatest.NewTestModel(t, New(f.fetch, 0, func() time.Time { return t0 }), teatest.WithInitialTermSize(120, 40))
	waitFor(t, tm, "NUMA 0  [##.~]")
	tm.Send(tea.KeyMsg{Type: tea.KeyDown})
	waitFor(t, tm, "h200-02: slot occupancy")
	tm.Send(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("q")})
	m := tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second)).(Model)
	if m.selected != "h200-02" {
		t.Fatalf("selected %q", m.selected)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.asked[len(f.asked)-1] != "h200-02" {
		t.Fatalf("fetches %q: the slots shown must be the highlighted node's", f.asked)
	}
}

// TestDashboardGolden pins the screen at a fixed size. Regenerate: go test ./internal/tui/dashboard -run Golden -update
func TestDashboardGolden(t *testing.T) {
	f := &fleet{}
	tm := teatest.NewTestModel(t, New(f.fetch, 0, func() time.Time { return t0 }), teatest.WithInitialTermSize(120, 40))
	waitFor(t, tm, "NUMA 1  [.Qxd]")
	tm.Send(tea.KeyMsg{Type: tea.KeyCtrlC})
	fm := tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second))
	teatest.RequireEqualOutput(t, []byte(fm.View()))
}

func TestDashboardShowsRefreshErrors(t *testing.T) {
	m := New(func(context.Context, string) (Snapshot, error) { return Snapshot{}, context.DeadlineExceeded }, 0, nil)
	next, _ := m.Update(snapMsg{err: context.DeadlineExceeded})
	if v := next.(Model).View(); !bytes.Contains([]byte(v), []byte("refresh failed: context deadline exceeded")) {
		t.Fatalf("view %q", v)
	}
}
