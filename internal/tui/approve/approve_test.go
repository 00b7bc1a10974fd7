package approve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/exp/teatest"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/topology"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

// report is a generated 8x H200 host whose last two GPUs have no fabric VF: 6 ready, 2 blocked.
func report(t *testing.T) *topology.Report {
	t.Helper()
	s := fixture.H200()
	s.Fabrics[6].VFs, s.Fabrics[7].VFs = nil, nil
	root := t.TempDir()
	if err := fixture.Write(root, s); err != nil {
		t.Fatal(err)
	}
	rep, err := topology.Discover(hostfs.New(root))
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// fakeController records the approve calls the screen makes.
type fakeController struct {
	mu    sync.Mutex
	calls []string
	fail  error
}

func (f *fakeController) approve(_ context.Context, idx []int, dryRun bool) (*apiv1.SlotApplyResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprint(idx)+map[bool]string{true: " dry", false: " apply"}[dryRun])
	if f.fail != nil && !dryRun {
		return nil, f.fail
	}
	// The host CPU sets the controller gives the H200 fixture's slots (11 two-thread cores each).
	res := &apiv1.SlotApplyResult{Applied: !dryRun, HousekeepingCPUs: "0,48,96,144"}
	for _, i := range idx {
		res.Changes = append(res.Changes, apiv1.SlotChange{SlotIndex: i, Action: "create",
			HostCPUs: fmt.Sprintf("%d-%d,%d-%d", 1+11*i+i/4, 11+11*i+i/4, 97+11*i+i/4, 107+11*i+i/4)})
	}
	return res, nil
}

func keys(tm *teatest.TestModel, ks ...string) {
	for _, k := range ks {
		switch k {
		case "space":
			tm.Send(tea.KeyMsg{Type: tea.KeySpace, Runes: []rune{' '}})
		case "down":
			tm.Send(tea.KeyMsg{Type: tea.KeyDown})
		case "enter":
			tm.Send(tea.KeyMsg{Type: tea.KeyEnter})
		default:
			tm.Send(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)})
		}
	}
}

func waitFor(t *testing.T, tm *teatest.TestModel, s string) {
	t.Helper()
	teatest.WaitFor(t, tm.Output(), func(b []byte) bool { return bytes.Contains(b, []byte(s)) },
		teatest.WithDuration(5*time.Second), teatest.WithCheckInterval(10*time.Millisecond))
}

func TestApproveSelectsReadyRowsAndSkipsBlocked(t *testing.T) {
	fc := &fakeController{}
	tm := teatest.NewTestModel(t, New("h200-01", report(t), fc.approve), teatest.WithInitialTermSize(130, 40))
	// Select slots 0 and 1, try the blocked slot 6, then review and approve.
	keys(tm, "space", "down", "space", "down", "down", "down", "down", "down", "space")
	waitFor(t, tm, "slot 6 is blocked")
	keys(tm, "enter")
	waitFor(t, tm, "y approve")
	keys(tm, "y")
	waitFor(t, tm, "approved: 2 slot changes applied on h200-01")
	keys(tm, "q")
	m := tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second)).(Model)
	if m.Approved == nil || len(m.Approved.Changes) != 2 {
		t.Fatalf("approved %+v", m.Approved)
	}
	if strings.Join(fc.calls, ";") != "[0 1] dry;[0 1] apply" {
		t.Fatalf("controller calls %q: a dry run for the diff, then the approval of exactly the chosen rows", fc.calls)
	}
}

// TestKeysInOneBurstAreEachHandled: keys typed or pasted in one burst reach the model as one
// message with several runes; each one acts, in order.
func TestKeysInOneBurstAreEachHandled(t *testing.T) {
	fc := &fakeController{}
	var m tea.Model = New("h200-01", report(t), fc.approve)
	m, _ = m.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("jj j ")})
	got := m.(Model)
	if got.cursor != 3 || fmt.Sprint(got.Chosen()) != "[2 3]" {
		t.Fatalf("after the burst \"jj j \": cursor %d, chosen %v; want 3, [2 3]", got.cursor, got.Chosen())
	}
}

func TestApproveDeclineAndFailure(t *testing.T) {
	fc := &fakeController{fail: errors.New("conflict: discovery is stale")}
	tm := teatest.NewTestModel(t, New("h200-01", report(t), fc.approve), teatest.WithInitialTermSize(130, 40))
	keys(tm, "enter")
	waitFor(t, tm, "nothing selected")
	keys(tm, "a", "enter")
	waitFor(t, tm, "y approve")
	keys(tm, "n")
	waitFor(t, tm, "not approved; selection kept")
	keys(tm, "enter")
	waitFor(t, tm, "y approve")
	keys(tm, "y")
	waitFor(t, tm, "approval failed: conflict: discovery is stale")
	keys(tm, "q")
	m := tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second)).(Model)
	if m.Approved != nil || len(m.Chosen()) != 6 {
		t.Fatalf("approved %+v chosen %v", m.Approved, m.Chosen())
	}
}

// TestApproveGolden pins the rendered screen (table, detail pane, confirm dialog) at a fixed
// size. Regenerate with: go test ./internal/tui/approve -run Golden -update
func TestApproveGolden(t *testing.T) {
	fc := &fakeController{}
	tm := teatest.NewTestModel(t, New("h200-01", report(t), fc.approve), teatest.WithInitialTermSize(130, 40))
	keys(tm, "space", "down", "down", "down", "down", "down", "down", "enter")
	waitFor(t, tm, "y approve")
	tm.Send(tea.KeyMsg{Type: tea.KeyCtrlC})
	fm := tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second))
	out, err := io.ReadAll(strings.NewReader(fm.View()))
	if err != nil {
		t.Fatal(err)
	}
	teatest.RequireEqualOutput(t, out)
}
