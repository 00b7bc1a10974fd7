package e2e

import (
	"context"
	"strconv"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// waitHealth polls a slot's health (as the script's current token) until it is the one
// wanted, within a deadline. Usage: waithealth NODE INDEX HEALTH [timeout]
func waitHealth(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 3 {
		ts.Fatalf("usage: waithealth NODE INDEX HEALTH [timeout]")
	}
	idx, err := strconv.Atoi(args[1])
	ts.Check(err)
	timeout := 30 * time.Second
	if len(args) == 4 {
		timeout, err = time.ParseDuration(args[3])
		ts.Check(err)
	}
	c := scriptClient(ts)
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		h, err := c.SlotHealth(context.Background(), args[0], idx)
		if err == nil {
			last = h.Health
			if h.Health == args[2] {
				return
			}
		}
		time.Sleep(100 * time.Millisecond) // health poll; the deadline bounds it
	}
	ts.Fatalf("slot %s/%d is %q after %s, want %q", args[0], idx, last, timeout, args[2])
}
