package cmdutil

import (
	"bytes"
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"
)

// WatchFlags are --watch and --interval.
type WatchFlags struct {
	Watch    bool
	Interval time.Duration
}

// AddWatchFlags adds --watch/-w and --interval to a read command whose result changes.
func AddWatchFlags(cmd *cobra.Command, w *WatchFlags) {
	cmd.Flags().BoolVarP(&w.Watch, "watch", "w", false, "keep showing it as it changes (Ctrl-C stops)")
	cmd.Flags().DurationVar(&w.Interval, "interval", 2*time.Second, "with --watch: how often to re-read")
}

// Render runs render once, or with --watch until ctx ends: every interval it re-renders and
// writes the result only when it changed. On a terminal the screen is cleared and redrawn
// in place; otherwise each changed rendering is appended (for -o json, one document each).
func (w WatchFlags) Render(ctx context.Context, ios IOStreams, render func(io.Writer) error) error {
	if !w.Watch {
		return render(ios.Out)
	}
	if w.Interval < 200*time.Millisecond {
		return FlagErrorf("--interval must be at least 200ms")
	}
	tty := IsTerminal(ios.Out)
	var last []byte
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		var buf bytes.Buffer
		if err := render(&buf); err != nil {
			return err
		}
		if !bytes.Equal(buf.Bytes(), last) {
			if tty {
				_, _ = io.WriteString(ios.Out, "\x1b[H\x1b[2J")
			}
			if _, err := ios.Out.Write(buf.Bytes()); err != nil {
				return err
			}
			last = buf.Bytes()
		}
		select {
		case <-ctx.Done():
			return nil // Ctrl-C ends a watch normally
		case <-t.C:
		}
	}
}
