package cmdutil

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"

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

// Confirm guards a destructive command, the same way everywhere: --yes goes ahead; on a
// terminal it asks "what. Continue? [y/N]" and goes ahead only on y or yes; elsewhere (a
// script, a pipe) it refuses with a usage error naming --yes, so nothing destructive happens
// by accident.
func Confirm(s IOStreams, yes bool, what string) error {
	if yes {
		return nil
	}
	if !s.Interactive() {
		return InputErrorf("%s: confirm with --yes", what)
	}
	fmt.Fprintf(s.ErrOut, "%s. Continue? [y/N] ", what)
	line, _ := bufio.NewReader(s.In).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return &SilentError{Code: ExitError}
}
