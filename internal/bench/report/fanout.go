package main

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/bench/fanout"
)

// Fan-out targets.
const (
	fanoutP99TargetMs     = 100
	fanoutBytesPerHostMax = 64 << 10
)

// fanoutSuite is dispatch fan-out latency to long-polling hosts over mTLS,
// and the controller's memory per parked poll.
type fanoutSuite struct {
	Mode      string        `json:"mode"`
	PollWait  string        `json:"poll_wait"`
	Dial      int           `json:"hosts_connecting_at_once"`
	Result    fanout.Result `json:"result"`
	TookSecs  float64       `json:"took_seconds"`
	PGVersion string        `json:"postgres_version"`
}

func runFanout(ctx context.Context, work, bin string, quick bool) (*fanoutSuite, error) {
	start := time.Now()
	o := fanout.Options{Hosts: 10000, Rate: 100, Duration: 30 * time.Second, Wait: 30 * time.Second, Dial: 64}
	s := &fanoutSuite{Mode: "full", Dial: o.Dial}
	if quick {
		o.Hosts, o.Duration, s.Mode = 1000, 10*time.Second, "quick"
	}
	s.PollWait = o.Wait.String()
	// Before the controller starts: it inherits the limit.
	if err := fanout.RaiseFileLimit(); err != nil {
		return nil, err
	}
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: filepath.Join(work, "fanout"), BinDir: bin, Pprof: true})
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	if err := env.DB.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&s.PGVersion); err != nil {
		return nil, err
	}
	fmt.Printf("fanout: %d hosts, %d tasks/s for %s...\n", o.Hosts, o.Rate, o.Duration)
	if s.Result, err = fanout.Run(ctx, env, o); err != nil {
		return nil, err
	}
	s.TookSecs = time.Since(start).Seconds()
	r := s.Result
	fmt.Printf("fanout: %d tasks p50 %.1f ms p99 %.1f ms max %.1f ms, lost %d dup %d; RSS %.0f -> %.0f MiB (%.1f KiB/host), heap %.1f KiB/host; connect %.1f s; controller %.2f CPUs, load %.1f\n",
		r.Tasks, r.P50ms, r.P99ms, r.MaxMs, r.Lost, r.Duplicates, r.RSSBeforeMiB, r.RSSAfterMiB, r.BytesPerHost/1024, r.HeapPerHost/1024, r.ConnectSeconds, r.ControllerCPU, r.Load1)
	return s, nil
}

func (s *fanoutSuite) markdown() string {
	r := s.Result
	var b strings.Builder
	fmt.Fprintf(&b, "## Dispatch fan-out (item 3)\n\n%d simulated hosts (%s mode), each on its own HTTPS connection (HTTP/1.1, as hostd) with its own ECDSA P-256 node certificate, long-poll one controller process (`GET /api/v1/agent/tasks?wait=%s`, hostd's default). The bench process commits %d tasks/s for %.0f s, each to a random host, one insert transaction each, then `pg_notify('gpuaas_node_tasks', node)`: the path a task committed by another controller replica takes. Hosts, PostgreSQL %s and the controller share the machine's cores; took %.0f s.\n\n",
		r.Hosts, s.Mode, s.PollWait, r.Rate, r.StreamSeconds, s.PGVersion, s.TookSecs)
	b.WriteString("| hosts | tasks | p50 ms | p90 ms | p99 ms | max ms | lost | duplicates | unexpected | refused | poll errors | RSS before MiB | RSS parked MiB | RSS KiB/host | Go heap+stacks KiB/host | connect s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %d | %d | %.1f | %.1f | %.1f | %.1f | %d | %d | %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n\n",
		r.Hosts, r.Tasks, r.P50ms, r.P90ms, r.P99ms, r.MaxMs, r.Lost, r.Duplicates, r.Unexpected, r.Refused, r.PollErrors,
		r.RSSBeforeMiB, r.RSSAfterMiB, r.BytesPerHost/1024, r.HeapPerHost/1024, r.ConnectSeconds)
	b.WriteString("- **p50/p90/p99/max**: commit-to-receipt, from the insert's COMMIT returning to the host's response decoded, both timed in the bench process. It spans the NOTIFY round trip (median " +
		fmt.Sprintf("%.1f ms", r.NotifyP50ms) + "; the insert transaction itself took a median " + fmt.Sprintf("%.1f ms", r.CommitP50ms) + ", not counted), the controller's LISTEN relay, the hub wake, the lease UPDATE, signing and the HTTPS response.\n")
	b.WriteString("- **lost / duplicates / unexpected**: committed tasks never received within 10 s of the last commit; tasks received more than once; tasks received that this run never committed. **refused**: envelopes failing hostd's checks (signature, node binding, validity). **poll errors**: failed polls (transport errors, answers other than 200/204)" + firstErr(r.FirstError) + ".\n")
	fmt.Fprintf(&b, "- **RSS**: the controller's VmRSS before any host connected and with every host's poll parked (all polls written, then the controller below 15%% of a CPU for a second, after %.1f s); per host is the difference over %d hosts.\n", r.SettleSeconds, r.Hosts)
	fmt.Fprintf(&b, "- **Go heap+stacks**: HeapInuse + StackInuse from the controller's pprof heap profile after a forced GC, before and parked (%.1f -> %.1f MiB; %d goroutines parked), per host: live Go memory of a parked poll (TLS connection, buffers, goroutines, timers, hub entry).\n", r.HeapBeforeMiB, r.HeapAfterMiB, r.Goroutines)
	fmt.Fprintf(&b, "- **connect**: from the first handshake to the last host's first poll sent, %d at a time.\n", s.Dial)
	worst := fanout.Second{At: -1}
	empty := 0
	for _, sec := range r.Series {
		if sec.MaxMs > worst.MaxMs {
			worst = sec
		}
		empty += sec.EmptyPolls
	}
	fmt.Fprintf(&b, "- **load**: during the stream the controller used %.2f CPUs; %d polls ran out their %s wait and were renewed (each renewal is an authentication and a lease query); the machine's 1-minute load average was %.1f on %d CPUs (other work on the machine shows here).", r.ControllerCPU, empty, s.PollWait, r.Load1, runtime.NumCPU())
	if worst.At >= 0 {
		fmt.Fprintf(&b, " Worst second of the stream: t=%d s, %d tasks, p99 %.1f ms, max %.1f ms, %d renewed polls (per second in report.json).", worst.At, worst.Tasks, worst.P99ms, worst.MaxMs, worst.EmptyPolls)
	}
	b.WriteString("\n\n")
	b.WriteString("**Targets**\n\n")
	fmt.Fprintf(&b, "- p99 commit-to-receipt <= %d ms with %d hosts: %.1f ms: %s.\n", fanoutP99TargetMs, r.Hosts, r.P99ms, verdict(r.Tasks > 0 && r.P99ms <= fanoutP99TargetMs))
	fmt.Fprintf(&b, "- controller memory per idle host <= 64 KiB: RSS %.1f KiB: %s (Go heap+stacks %.1f KiB).\n", r.BytesPerHost/1024, verdict(r.BytesPerHost <= fanoutBytesPerHostMax), r.HeapPerHost/1024)
	fmt.Fprintf(&b, "- every task received exactly once: lost %d, duplicates %d: %s.\n", r.Lost, r.Duplicates, verdict(r.Tasks > 0 && r.Lost == 0 && r.Duplicates == 0))
	return b.String()
}

func firstErr(e string) string {
	if e == "" {
		return ""
	}
	return fmt.Sprintf("; the first: `%s`", strings.ReplaceAll(e, "`", "'"))
}
