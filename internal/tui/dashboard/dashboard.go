// Package dashboard is `gpuaasctl dashboard`: a live fleet screen. The top table lists the
// nodes (mode, heartbeat age, slots in use by status); below it, the highlighted node's slot
// occupancy per NUMA group and the tasks in flight across the fleet. It refreshes on a
// timer; bubbletea redraws only what changed, so the screen does not flicker. Like the approve
// screen, the model does no I/O itself: it is given a Fetch function.
package dashboard

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Snapshot is one refresh: every node, the selected node's slots, the tasks in flight.
type Snapshot struct {
	Nodes []apiv1.Node
	Slots []apiv1.Slot // of the node named in the Fetch call
	Tasks []apiv1.Task // queued or leased (running)
	At    time.Time
}

// FetchFunc loads a snapshot; node is the highlighted node's name ("" = none yet).
type FetchFunc func(ctx context.Context, node string) (Snapshot, error)

// Model is the dashboard.
type Model struct {
	fetch    FetchFunc
	every    time.Duration
	now      func() time.Time
	snap     Snapshot
	err      error
	cursor   int
	selected string // node name under the cursor
	width    int
	loading  bool
}

// New builds the dashboard; it refreshes every `every` (0: only on r).
func New(fetch FetchFunc, every time.Duration, now func() time.Time) Model {
	if now == nil {
		now = time.Now
	}
	return Model{fetch: fetch, every: every, now: now, width: 120, loading: true}
}

type snapMsg struct {
	s   Snapshot
	err error
}

type tickMsg struct{}

func (m Model) load() tea.Cmd {
	fetch, node := m.fetch, m.selected
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		s, err := fetch(ctx, node)
		return snapMsg{s, err}
	}
}

func (m Model) tick() tea.Cmd {
	if m.every <= 0 {
		return nil
	}
	return tea.Tick(m.every, func(time.Time) tea.Msg { return tickMsg{} })
}

// Init loads the first snapshot.
func (m Model) Init() tea.Cmd { return m.load() }

// Update handles keys, refresh ticks and snapshots.
func (m Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width = msg.Width
	case tickMsg:
		return m, m.load()
	case snapMsg:
		m.loading = false
		m.err = msg.err
		if msg.err == nil {
			m.snap = msg.s
			sort.Slice(m.snap.Nodes, func(i, j int) bool { return m.snap.Nodes[i].Name < m.snap.Nodes[j].Name })
			// Keep the cursor on the same node across refreshes.
			m.cursor = 0
			for i, n := range m.snap.Nodes {
				if n.Name == m.selected {
					m.cursor = i
				}
			}
			prev := m.selected
			if len(m.snap.Nodes) > 0 {
				m.selected = m.snap.Nodes[m.cursor].Name
			}
			if m.selected != prev {
				return m, m.load() // the slots shown must be the highlighted node's
			}
		}
		return m, m.tick()
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "esc", "ctrl+c":
			return m, tea.Quit
		case "up", "k":
			if m.cursor > 0 {
				m.cursor--
				m.selected = m.snap.Nodes[m.cursor].Name
				return m, m.load()
			}
		case "down", "j":
			if m.cursor < len(m.snap.Nodes)-1 {
				m.cursor++
				m.selected = m.snap.Nodes[m.cursor].Name
				return m, m.load()
			}
		case "r":
			return m, m.load()
		}
	}
	return m, nil
}

var (
	title  = lipgloss.NewStyle().Bold(true)
	header = lipgloss.NewStyle().Bold(true).Underline(true)
	cur    = lipgloss.NewStyle().Reverse(true)
	faint  = lipgloss.NewStyle().Faint(true)
	bad    = lipgloss.NewStyle().Foreground(lipgloss.Color("1"))
	box    = lipgloss.NewStyle().Border(lipgloss.RoundedBorder()).Padding(0, 1)
)

func (m Model) age(t *time.Time) string {
	if t == nil {
		return "never"
	}
	d := m.now().Sub(*t).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

// View renders the dashboard.
func (m Model) View() string {
	var b strings.Builder
	at := "loading…"
	if !m.snap.At.IsZero() {
		at = "as of " + m.snap.At.UTC().Format("15:04:05Z")
	}
	running := 0
	for _, t := range m.snap.Tasks {
		if t.Status == "leased" {
			running++
		}
	}
	b.WriteString(title.Render("gpuaas fleet") + fmt.Sprintf("  %d nodes · %d tasks running, %d queued · %s\n\n",
		len(m.snap.Nodes), running, len(m.snap.Tasks)-running, at))
	if m.err != nil {
		b.WriteString(bad.Render("refresh failed: "+m.err.Error()) + "\n\n")
	}
	b.WriteString(header.Render(fmt.Sprintf("%-18s %-8s %-16s %-10s %-10s %-5s %-5s %-6s %-6s %s",
		"NODE", "REGION", "MODE", "STATUS", "HEARTBEAT", "SLOTS", "FREE", "USED", "BLOCK", "DRAIN")))
	b.WriteString("\n")
	for i, n := range m.snap.Nodes {
		s := n.SlotSummary
		used := s.ByStatus["reserved"] + s.ByStatus["provisioning"] + s.ByStatus["active"] + s.ByStatus["releasing"] + s.ByStatus["cleanup"]
		blocked := s.ByStatus["failed"] + s.ByStatus["cleanup_blocked"] + s.ByStatus["disabled"]
		drain := ""
		if n.Draining {
			drain = "yes"
		}
		line := fmt.Sprintf("%-18s %-8s %-16s %-10s %-10s %-5d %-5d %-6d %-6d %s", trunc(n.Name, 18), trunc(n.Region, 8), n.Mode, n.Status,
			m.age(n.LastHeartbeatAt), s.Total, s.ByStatus["available"], used, blocked, drain)
		if i == m.cursor {
			line = cur.Render(line)
		}
		b.WriteString(line + "\n")
	}
	if len(m.snap.Nodes) == 0 && !m.loading {
		b.WriteString(faint.Render("no nodes registered (gpuaasctl nodes add)") + "\n")
	}
	b.WriteString("\n" + m.numaView() + "\n" + m.tasksView() + "\n")
	b.WriteString(faint.Render("↑/↓ node · r refresh · q quit"))
	return b.String()
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

// numaView draws the highlighted node's slots per NUMA group: one cell per slot.
func (m Model) numaView() string {
	if m.selected == "" {
		return box.Render("no node selected")
	}
	groups := map[string][]apiv1.Slot{}
	for _, s := range m.snap.Slots {
		k := "?"
		if s.NUMANode != nil {
			k = fmt.Sprint(*s.NUMANode)
		}
		groups[k] = append(groups[k], s)
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	lines := []string{fmt.Sprintf("%s: slot occupancy by NUMA group   (. free  # in use  ~ moving  x blocked  Q quarantined  d degraded)", m.selected)}
	for _, k := range keys {
		ss := groups[k]
		sort.Slice(ss, func(i, j int) bool { return ss[i].SlotIndex < ss[j].SlotIndex })
		var cells, idx []string
		for _, s := range ss {
			cells = append(cells, healthCell(s))
			idx = append(idx, fmt.Sprint(s.SlotIndex))
		}
		lines = append(lines, fmt.Sprintf("NUMA %-2s [%s]  slots %s", k, strings.Join(cells, ""), strings.Join(idx, ",")))
	}
	if len(keys) == 0 {
		lines = append(lines, "no approved slots")
	}
	return box.Render(strings.Join(lines, "\n"))
}

// healthCell is a slot's cell with its health: a quarantined slot is Q whatever its status (it
// is never sold); a degraded one that is free is d (sold, under watch).
func healthCell(s apiv1.Slot) string {
	switch {
	case s.Health == apiv1.HealthQuarantined:
		return "Q"
	case s.Health == apiv1.HealthDegraded && s.Status == "available":
		return "d"
	}
	return cell(s.Status)
}

func cell(status string) string {
	switch status {
	case "available":
		return "."
	case "active", "provisioning":
		return "#"
	case "reserved", "releasing", "cleanup":
		return "~"
	default:
		return "x"
	}
}

func (m Model) tasksView() string {
	names := map[string]string{}
	for _, n := range m.snap.Nodes {
		names[n.ID] = n.Name
	}
	lines := []string{"tasks in flight"}
	shown := 0
	for _, t := range m.snap.Tasks {
		if shown == 8 {
			lines = append(lines, fmt.Sprintf("… %d more", len(m.snap.Tasks)-shown))
			break
		}
		last := "-"
		if n := len(t.Phases); n > 0 {
			last = t.Phases[n-1].Name + " " + t.Phases[n-1].Status
		}
		lines = append(lines, fmt.Sprintf("%-8s %-24s %-14s %-7s #%d  %s", t.ID[:min(8, len(t.ID))], t.Type, trunc(names[t.NodeID], 14), t.Status, t.Attempt, last))
		shown++
	}
	if shown == 0 {
		lines = append(lines, faint.Render("none"))
	}
	return box.Render(strings.Join(lines, "\n"))
}
