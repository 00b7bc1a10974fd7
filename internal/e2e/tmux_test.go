package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// A real terminal: tmux runs gpuaasctl on a pseudo-terminal; keys are typed with send-keys
// and the screen is read with capture-pane.

// tmuxStart starts `gpuaasctl ARGS...` in a detached tmux session named NAME (140x45) with
// the script's environment, and stops the session when the script ends. With -raw, the
// program's output is a byte stream, not a terminal's: each byte that is not printable text
// or a newline reaches the screen as '.', so that no byte of it can move the cursor or clear
// the screen (a raw SSH stream's random key-exchange cookie once overwrote the banner the
// script waited for).
// Usage: tmuxstart [-raw] NAME ARGS...
func tmuxStart(ts *testscript.TestScript, neg bool, args []string) {
	raw := len(args) > 0 && args[0] == "-raw"
	if raw {
		args = args[1:]
	}
	if neg || len(args) < 2 {
		ts.Fatalf("usage: tmuxstart [-raw] NAME gpuaasctl-args...")
	}
	// The exit marker goes on a line of its own after CAN (0x18), which ends any escape
	// sequence the program's last bytes left open: a raw SSH stream's binary key exchange
	// once swallowed the marker's first letter.
	run := "gpuaasctl " + strings.Join(args[1:], " ") + "; s=$?; printf '\030\n'; echo TUI-EXIT=$s"
	if raw {
		run = "{ gpuaasctl " + strings.Join(args[1:], " ") + "; s=$?; printf '\nTUI-EXIT=%s\n' $s; } | tr -c '[:print:]\n' ."
	}
	sock := tmuxSocket(ts)
	tmuxArgs := []string{"-L", sock, "new-session", "-d", "-s", args[0], "-x", "140", "-y", "45"}
	for _, k := range []string{"PATH", "HOME", "GPUAAS_SERVER", "GPUAAS_CA_FILE", "GPUAAS_TOKEN_FILE", "GPUAAS_TOKEN"} {
		tmuxArgs = append(tmuxArgs, "-e", k+"="+ts.Getenv(k))
	}
	tmuxArgs = append(tmuxArgs, "-e", "TERM=xterm-256color", "-e", "NO_COLOR=", run+"; sleep 600")
	if out, err := (hostfs.Exec{}).Run(context.Background(), "tmux", tmuxArgs...); err != nil {
		ts.Fatalf("tmux new-session: %v %s", err, out)
	}
	ts.Defer(func() { _, _ = (hostfs.Exec{}).Run(context.Background(), "tmux", "-L", sock, "kill-server") })
}

func tmuxSocket(ts *testscript.TestScript) string {
	return fmt.Sprintf("gpuaas-e2e-%d-%s", os.Getpid(), filepath.Base(ts.Getenv("WORK"))) // one tmux server per script
}

// tmuxKeys types keys into a session (tmux key names: Space, Down, Enter, y, ...).
// Usage: tmuxkeys NAME KEY...
func tmuxKeys(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: tmuxkeys NAME KEY...")
	}
	for _, k := range args[1:] {
		if out, err := (hostfs.Exec{}).Run(context.Background(), "tmux", "-L", tmuxSocket(ts), "send-keys", "-t", args[0], k); err != nil {
			ts.Fatalf("tmux send-keys %s: %v %s", k, err, out)
		}
	}
}

// tmuxWait waits until the session's screen contains TEXT (within 30 s, or TIMEOUT) and logs
// the screen; TEXT "re:EXPR" is a regular expression (multi-line).
// Usage: tmuxwait NAME TEXT [TIMEOUT]
func tmuxWait(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 || len(args) > 3 {
		ts.Fatalf("usage: tmuxwait NAME TEXT [TIMEOUT]")
	}
	timeout := 30 * time.Second
	if len(args) == 3 {
		d, err := time.ParseDuration(args[2])
		ts.Check(err)
		timeout = d
	}
	match := func(s string) bool { return strings.Contains(s, args[1]) }
	if expr, ok := strings.CutPrefix(args[1], "re:"); ok {
		re, err := regexp.Compile("(?m)" + expr)
		ts.Check(err)
		match = re.MatchString
	}
	deadline := time.Now().Add(timeout)
	screen := ""
	for time.Now().Before(deadline) {
		out, err := (hostfs.Exec{}).Run(context.Background(), "tmux", "-L", tmuxSocket(ts), "capture-pane", "-p", "-t", args[0])
		if err == nil {
			screen = string(out)
			if match(screen) {
				ts.Logf("screen:\n%s", screen)
				return
			}
		}
		time.Sleep(100 * time.Millisecond) // screen poll; the deadline bounds it
	}
	ts.Fatalf("%q never appeared; the screen:\n%s", args[1], screen)
}

// tmuxResize resizes a session's window (the program sees SIGWINCH).
// Usage: tmuxresize NAME COLS ROWS
func tmuxResize(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: tmuxresize NAME COLS ROWS")
	}
	if out, err := (hostfs.Exec{}).Run(context.Background(), "tmux", "-L", tmuxSocket(ts), "resize-window", "-t", args[0], "-x", args[1], "-y", args[2]); err != nil {
		ts.Fatalf("tmux resize-window: %v %s", err, out)
	}
}
