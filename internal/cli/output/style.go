package output

import (
	"io"
	"os"
	"strings"

	"github.com/charmbracelet/lipgloss"
	"github.com/mattn/go-isatty"
)

// terminal reports whether w is a terminal.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// Styled reports whether w gets colour: a terminal, NO_COLOR unset (https://no-color.org)
// and TERM not "dumb". Pipes, files and tests get plain, stable text.
func Styled(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || !(isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())) {
		return false
	}
	return os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
}

var (
	headerStyle = lipgloss.NewStyle().Bold(true)
	goodStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("2"))
	badStyle    = lipgloss.NewStyle().Foreground(lipgloss.Color("1"))
	busyStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("3"))
	faintStyle  = lipgloss.NewStyle().Faint(true)
)

// StatusStyle colours a status word by what it means for the operator.
func StatusStyle(s string) lipgloss.Style {
	switch s {
	case "active", "available", "ready", "succeeded", "ok", "verified", "true", "yes", "slice_supported", "both_capable":
		return goodStyle
	case "failed", "cleanup_blocked", "blocked", "unreachable", "expired", "refused", "disabled", "false", "no":
		return badStyle
	case "provisioning", "releasing", "requested", "reserved", "running", "queued", "leased", "cleanup", "skipped", "draining", "simulated", "SIMULATED":
		return busyStyle
	case "-", "released", "retired":
		return faintStyle
	}
	return lipgloss.NewStyle()
}

func isHeader(cells []string) bool {
	seen := false
	for _, c := range cells {
		if c == "" {
			continue
		}
		if strings.ToUpper(c) != c || strings.ContainsAny(c, "0123456789") && !strings.ContainsAny(c, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
			return false
		}
		seen = true
	}
	return seen
}

// renderStyled writes blocks of rows aligned by display width, headers bold and status
// words coloured.
func renderStyled(w io.Writer, blocks [][][]string) error {
	for bi, rows := range blocks {
		var widths []int
		for _, r := range rows {
			for i, c := range r {
				if i >= len(widths) {
					widths = append(widths, 0)
				}
				if n := lipgloss.Width(c); n > widths[i] {
					widths[i] = n
				}
			}
		}
		for _, r := range rows {
			header := isHeader(r)
			var b strings.Builder
			for i, c := range r {
				pad := ""
				if i < len(r)-1 {
					pad = strings.Repeat(" ", widths[i]-lipgloss.Width(c)+2)
				}
				switch {
				case header:
					c = headerStyle.Render(c)
				default:
					c = StatusStyle(c).Render(c)
				}
				b.WriteString(c + pad)
			}
			if _, err := io.WriteString(w, strings.TrimRight(b.String(), " ")+"\n"); err != nil {
				return err
			}
		}
		if bi < len(blocks)-1 {
			if _, err := io.WriteString(w, "\n"); err != nil {
				return err
			}
		}
	}
	return nil
}
