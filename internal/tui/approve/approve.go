// Package approve is the interactive `gpuaasctl slots approve` screen: a bubbletea model
// listing a node's discovered candidate bundles (GPU, fabric VF, NVMe, NUMA, IOMMU group,
// status). Space toggles a ready row; blocked rows show their reason and cannot be chosen;
// the highlighted row's details, with its NUMA node's CPUs, are shown below the table. Enter
// asks the controller for the diff against the node's existing slots (a dry run), with each
// slot's host CPU set and the node's housekeeping set, and shows it in a confirm dialog; y
// approves, and the result is shown. The model does no I/O itself: the controller calls are
// commands built from the Approve function it is given, so tests drive it with key messages.
package approve

import (
	"context"
	"fmt"
	"sort"
	"strings"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/topology"
)

// ApproveFunc calls the controller: a dry run returns the diff, otherwise it approves.
type ApproveFunc func(ctx context.Context, indexes []int, dryRun bool) (*apiv1.SlotApplyResult, error)

type stage int

const (
	browsing   stage = iota
	diffing          // waiting for the dry run
	confirming       // showing the diff, y/n
	submitting       // waiting for the approval
	done             // result shown; any key quits
)

// Model is the approve screen.
type Model struct {
	Node       string
	candidates []topology.Candidate
	iommu      map[string]string // GPU PCI -> IOMMU group
	numaCPUs   map[int]string    // NUMA node -> its CPUs and core count
	selected   map[int]bool      // candidate slot index -> chosen
	cursor     int
	stage      stage
	diff       *apiv1.SlotApplyResult
	result     *apiv1.SlotApplyResult
	err        error
	note       string // one-line feedback, e.g. why a row cannot be chosen
	approve    ApproveFunc
	width      int
	// Approved is the result once the approval succeeded (nil if cancelled or failed).
	Approved *apiv1.SlotApplyResult
}

// New builds the screen from a discovery report.
func New(node string, rep *topology.Report, approve ApproveFunc) Model {
	m := Model{Node: node, iommu: map[string]string{}, numaCPUs: map[int]string{}, selected: map[int]bool{}, approve: approve, width: 100}
	if rep != nil {
		m.candidates = append(m.candidates, rep.Candidates...)
		for _, n := range rep.NUMA {
			m.numaCPUs[n.Node] = fmt.Sprintf("%s (%d cores)", n.CPUs, len(n.Cores))
		}
		for _, g := range rep.GPUs {
			if g.IOMMUGroup != nil {
				m.iommu[g.PCIAddress] = fmt.Sprint(*g.IOMMUGroup)
			}
		}
	}
	sort.Slice(m.candidates, func(i, j int) bool { return m.candidates[i].SlotIndex < m.candidates[j].SlotIndex })
	return m
}

// Init starts nothing: the screen waits for keys.
func (m Model) Init() tea.Cmd { return nil }

type diffMsg struct {
	res *apiv1.SlotApplyResult
	err error
}

type resultMsg struct {
	res *apiv1.SlotApplyResult
	err error
}

// Chosen are the selected candidate slot indexes, ascending.
func (m Model) Chosen() []int {
	var out []int
	for _, c := range m.candidates {
		if m.selected[c.SlotIndex] {
			out = append(out, c.SlotIndex)
		}
	}
	return out
}

func (m Model) call(dryRun bool) tea.Cmd {
	idx, approve := m.Chosen(), m.approve
	return func() tea.Msg {
		res, err := approve(context.Background(), idx, dryRun)
		if dryRun {
			return diffMsg{res, err}
		}
		return resultMsg{res, err}
	}
}

// Update handles keys and the controller's answers.
func (m Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width = msg.Width
		return m, nil
	case diffMsg:
		if msg.err != nil {
			m.stage, m.note = browsing, "dry run failed: "+msg.err.Error()
			return m, nil
		}
		m.stage, m.diff = confirming, msg.res
		return m, nil
	case resultMsg:
		m.stage, m.result, m.err = done, msg.res, msg.err
		if msg.err == nil {
			m.Approved = msg.res
		}
		return m, nil
	case tea.KeyMsg:
		return m.keys(msg)
	}
	return m, nil
}

// keys handles a key message. Keys typed or pasted in one burst arrive as one message with
// several runes ("jj " for j, j, space): each is handled in turn, as if typed alone.
func (m Model) keys(k tea.KeyMsg) (tea.Model, tea.Cmd) {
	if k.Type != tea.KeyRunes || len(k.Runes) < 2 {
		return m.key(k)
	}
	var cmds []tea.Cmd
	var model tea.Model = m
	for _, r := range k.Runes {
		one := tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{r}, Alt: k.Alt}
		if r == ' ' {
			one.Type = tea.KeySpace
		}
		var cmd tea.Cmd
		model, cmd = model.(Model).key(one)
		cmds = append(cmds, cmd)
	}
	return model, tea.Sequence(cmds...)
}

func (m Model) key(k tea.KeyMsg) (tea.Model, tea.Cmd) {
	if k.String() == "ctrl+c" {
		return m, tea.Quit
	}
	switch m.stage {
	case done:
		return m, tea.Quit
	case diffing, submitting:
		return m, nil // waiting for the controller
	case confirming:
		switch k.String() {
		case "y", "Y":
			m.stage = submitting
			return m, m.call(false)
		case "n", "N", "esc":
			m.stage, m.diff, m.note = browsing, nil, "not approved; selection kept"
		}
		return m, nil
	}
	m.note = ""
	switch k.String() {
	case "q", "esc":
		return m, tea.Quit
	case "up", "k":
		if m.cursor > 0 {
			m.cursor--
		}
	case "down", "j":
		if m.cursor < len(m.candidates)-1 {
			m.cursor++
		}
	case " ", "x":
		if len(m.candidates) == 0 {
			break
		}
		c := m.candidates[m.cursor]
		if !c.Ready {
			m.note = fmt.Sprintf("slot %d is blocked: %s", c.SlotIndex, strings.Join(c.BlockingReasons, "; "))
			break
		}
		m.selected[c.SlotIndex] = !m.selected[c.SlotIndex]
	case "a":
		for _, c := range m.candidates {
			if c.Ready {
				m.selected[c.SlotIndex] = true
			}
		}
	case "n":
		m.selected = map[int]bool{}
	case "enter":
		if len(m.Chosen()) == 0 {
			m.note = "nothing selected: space toggles a ready row, a selects all ready rows"
			break
		}
		m.stage = diffing
		return m, m.call(true)
	}
	return m, nil
}

var (
	titleStyle   = lipgloss.NewStyle().Bold(true)
	headerStyle  = lipgloss.NewStyle().Bold(true).Underline(true)
	cursorStyle  = lipgloss.NewStyle().Reverse(true)
	blockedStyle = lipgloss.NewStyle().Faint(true)
	okStyle      = lipgloss.NewStyle().Foreground(lipgloss.Color("2"))
	badStyle     = lipgloss.NewStyle().Foreground(lipgloss.Color("1"))
	boxStyle     = lipgloss.NewStyle().Border(lipgloss.RoundedBorder()).Padding(0, 1)
	helpStyle    = lipgloss.NewStyle().Faint(true)
)

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func numa(n *int) string {
	if n == nil {
		return "?"
	}
	return fmt.Sprint(*n)
}

// View renders the screen.
func (m Model) View() string {
	var b strings.Builder
	b.WriteString(titleStyle.Render(fmt.Sprintf("Approve slots on %s", m.Node)))
	b.WriteString(fmt.Sprintf("  %d candidates, %d selected\n\n", len(m.candidates), len(m.Chosen())))
	if len(m.candidates) == 0 {
		b.WriteString("No candidates: run `gpuaasctl topology discover " + m.Node + " --wait` first.\n\n" + helpStyle.Render("q quit"))
		return b.String()
	}
	b.WriteString(headerStyle.Render(fmt.Sprintf("%-3s %-4s %-13s %-13s %-40s %-4s %-5s %s", "", "SLOT", "GPU", "FABRIC VF", "NVME (by-id)", "NUMA", "IOMMU", "STATUS")))
	b.WriteString("\n")
	for i, c := range m.candidates {
		mark := "[ ]"
		if m.selected[c.SlotIndex] {
			mark = "[x]"
		}
		status := "ready"
		if !c.Ready {
			mark, status = " - ", "blocked: "+strings.Join(c.BlockingReasons, "; ")
		}
		nvme := strings.TrimPrefix(c.NVMeDevice, "/dev/disk/by-id/")
		if len(nvme) > 40 {
			nvme = "…" + nvme[len(nvme)-39:]
		}
		line := fmt.Sprintf("%-3s %-4d %-13s %-13s %-40s %-4s %-5s %s", mark, c.SlotIndex, dash(c.GPUPCI), dash(c.FabricVFPCI), dash(nvme),
			numa(c.NUMANode), dash(m.iommu[c.GPUPCI]), status)
		if m.width > 10 && len(line) > m.width-1 {
			line = line[:m.width-2] + "…"
		}
		switch {
		case i == m.cursor:
			line = cursorStyle.Render(line)
		case !c.Ready:
			line = blockedStyle.Render(line)
		}
		b.WriteString(line + "\n")
	}
	b.WriteString("\n" + m.detail() + "\n")
	switch m.stage {
	case diffing:
		b.WriteString("asking the controller for the diff…\n")
	case confirming:
		b.WriteString(boxStyle.Render(m.diffText()) + "\n")
	case submitting:
		b.WriteString("approving…\n")
	case done:
		if m.err != nil {
			b.WriteString(badStyle.Render("approval failed: "+m.err.Error()) + "\n" + helpStyle.Render("any key quits") + "\n")
		} else {
			b.WriteString(okStyle.Render(fmt.Sprintf("approved: %d slot changes applied on %s", len(m.result.Changes), m.Node)) + "\n" +
				helpStyle.Render("any key quits") + "\n")
		}
	}
	if m.note != "" {
		b.WriteString(badStyle.Render(m.note) + "\n")
	}
	if m.stage == browsing {
		b.WriteString(helpStyle.Render("↑/↓ move · space toggle · a all ready · n none · enter review and approve · q quit"))
	}
	return b.String()
}

func (m Model) detail() string {
	c := m.candidates[m.cursor]
	lines := []string{
		fmt.Sprintf("slot %d  %s  GPU %s (%s)", c.SlotIndex, map[bool]string{true: "ready", false: "blocked"}[c.Ready], dash(c.GPUPCI), dash(c.GPUModel)),
		fmt.Sprintf("fabric %s  PF %s  VF %s", dash(c.Fabric), dash(c.FabricParentPCI), dash(c.FabricVFPCI)),
		fmt.Sprintf("NVMe %s  namespace %s  NUMA %s  IOMMU group %s", dash(c.NVMeDevice), dash(c.NVMeNamespace), numa(c.NUMANode), dash(m.iommu[c.GPUPCI])),
	}
	if c.NUMANode != nil {
		lines = append(lines, fmt.Sprintf("host CPUs: whole cores of NUMA node %d, CPUs %s; the controller picks the slot's at review", *c.NUMANode, dash(m.numaCPUs[*c.NUMANode])))
	}
	for _, r := range c.BlockingReasons {
		lines = append(lines, "blocked: "+r)
	}
	return boxStyle.Render(strings.Join(lines, "\n"))
}

func (m Model) diffText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Approve %d slots on %s? Their disks become tenant storage, wiped on every release.\n\n", len(m.Chosen()), m.Node)
	for _, ch := range m.diff.Changes {
		fields := ""
		if len(ch.Fields) > 0 {
			fields = " (" + strings.Join(ch.Fields, ", ") + ")"
		}
		cpus := ""
		if ch.HostCPUs != "" {
			cpus = "  host CPUs " + ch.HostCPUs
		}
		fmt.Fprintf(&b, "  slot %d: %s%s%s\n", ch.SlotIndex, ch.Action, fields, cpus)
	}
	if len(m.diff.Changes) == 0 {
		b.WriteString("  no changes: the node's slots already match\n")
	}
	fmt.Fprintf(&b, "  housekeeping CPUs (kept for the host): %s\n", dash(m.diff.HousekeepingCPUs))
	b.WriteString("\ny approve · n back")
	return b.String()
}
