package cmdutil

import (
	"io"
	"os"

	"github.com/mattn/go-isatty"
)

// IsTerminal reports whether s is an interactive terminal (an *os.File on a TTY).
func IsTerminal(s any) bool {
	f, ok := s.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// Interactive reports whether both standard input and output are terminals: only then may a
// command prompt or draw a TUI.
func (s IOStreams) Interactive() bool { return IsTerminal(s.In) && IsTerminal(s.Out) }

// Styled reports whether w should get colours and live redraws: a terminal, and NO_COLOR
// unset (https://no-color.org).
func Styled(w io.Writer, getenv func(string) string) bool {
	return IsTerminal(w) && (getenv == nil || getenv("NO_COLOR") == "") && (getenv == nil || getenv("TERM") != "dumb")
}
