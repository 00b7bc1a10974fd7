package agent

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ping is one datagram hostd sent to NOTIFY_SOCKET.
type ping struct {
	at  time.Time
	msg string
}

// notifySocket listens where systemd would (a unixgram socket named by NOTIFY_SOCKET) and
// returns the WATCHDOG=1 pings as they arrive.
func notifySocket(t *testing.T, watchdog time.Duration) <-chan ping {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", strconv.FormatInt(int64(watchdog/time.Microsecond), 10))
	t.Setenv("WATCHDOG_PID", "")
	out := make(chan ping, 1024)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			if strings.Contains(string(buf[:n]), "WATCHDOG=1") {
				out <- ping{time.Now(), string(buf[:n])}
			}
		}
	}()
	return out
}

// The systemd watchdog is fed while the poll loop turns, stops while the loop is stuck (a
// real NOTIFY_SOCKET reads the pings), and resumes when the loop moves again.
func TestWatchdogFedOnlyWhileThePollLoopProgresses(t *testing.T) {
	const wd = 400 * time.Millisecond
	pings := notifySocket(t, wd)
	f := newFake(t)
	a, err := New(identity(t, f, "node-wd"), slog.New(slog.DiscardHandler), "test")
	if err != nil {
		t.Fatal(err)
	}
	var stuck atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a.knobs.LoopStep = func(ctx context.Context) {
		if !stuck.Load() {
			return
		}
		once.Do(func() { close(entered) })
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	next := func(within time.Duration) (ping, bool) {
		select {
		case p := <-pings:
			return p, true
		case <-time.After(within):
			return ping{}, false
		}
	}
	for i := range 3 {
		if _, ok := next(10 * time.Second); !ok {
			t.Fatalf("running loop: ping %d never came", i+1)
		}
	}

	stuck.Store(true)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the poll loop never reached its step")
	}
	stuckAt := time.Now()
	// The loop promised progress within one WatchdogSec; well past it, no ping may arrive.
	quiet := stuckAt.Add(2 * wd)
	end := stuckAt.Add(6 * wd)
	for {
		p, ok := next(time.Until(end))
		if !ok {
			break
		}
		if p.at.After(quiet) {
			t.Fatalf("watchdog fed %s after the poll loop got stuck (WatchdogSec %s)", p.at.Sub(stuckAt), wd)
		}
	}

	stuck.Store(false)
	close(release)
	if _, ok := next(10 * time.Second); !ok {
		t.Fatal("watchdog not fed again once the loop moved")
	}
}
