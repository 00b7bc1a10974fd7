package alloc

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/task"
)

// phaseLog writes a task's phases as they complete, one line each. On a terminal it also
// keeps a live status line at the bottom (spinner, progress bar, the phase in flight, elapsed
// time), redrawn in place; piped, it writes only the plain lines.
type phaseLog struct {
	w      io.Writer
	live   bool
	start  time.Time
	frame  int
	status string
}

var spinner = []rune("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")

// line prints a finished phase (or any message) above the status line.
func (p *phaseLog) line(s string) {
	if p.live {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
	fmt.Fprintln(p.w, s)
	p.redraw()
}

// progress sets the status line from the newest task's phases.
func (p *phaseLog) progress(tk apiv1.AllocationTask) {
	if !p.live {
		return
	}
	all := task.PhasesOf(tk.Type)
	done, running := 0, ""
	for _, ph := range tk.Phases {
		if ph.Status == "running" {
			running = ph.Name + " " + ph.Detail
			continue
		}
		done++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s #%d ", tk.Type, tk.Attempt)
	if n := len(all); n > 0 {
		filled := done * 20 / n
		if filled > 20 {
			filled = 20
		}
		fmt.Fprintf(&b, "[%s%s] %d/%d ", strings.Repeat("█", filled), strings.Repeat("░", 20-filled), done, n)
		if running == "" && done < n {
			running = all[done]
		}
	}
	if running != "" {
		fmt.Fprintf(&b, "%s ", strings.TrimSpace(running))
	}
	fmt.Fprintf(&b, "(%s)", time.Since(p.start).Round(100*time.Millisecond))
	p.status = b.String()
	p.redraw()
}

func (p *phaseLog) redraw() {
	if !p.live || p.status == "" {
		return
	}
	fmt.Fprintf(p.w, "\r\x1b[K%c %s", spinner[p.frame%len(spinner)], p.status)
	p.frame++
}

// close clears the status line.
func (p *phaseLog) close() {
	if p.live && p.status != "" {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
}
