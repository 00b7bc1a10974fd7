package fanout

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// proc observes the controller from outside: /proc for RSS and CPU time, its pprof listener
// for the Go heap.
type proc struct {
	pid int
	env *benchenv.Env // its Pprof serves the heap figures when the controller has profiles on
}

type memory struct {
	rss        int64 // bytes
	heap       int64 // HeapInuse + StackInuse after a GC, bytes; 0 without pprof
	goroutines int
}

func (p proc) memory(ctx context.Context) (memory, error) {
	var m memory
	if p.env.PprofAddr != "" {
		// gc=1 collects first, so the figure is live memory rather than garbage awaiting GC.
		text, err := p.env.Pprof(ctx, "/debug/pprof/heap?debug=1&gc=1")
		if err != nil {
			return m, err
		}
		if m.heap, err = heapInUse(string(text)); err != nil {
			return m, err
		}
		if text, err = p.env.Pprof(ctx, "/debug/pprof/goroutine?debug=1"); err != nil {
			return m, err
		}
		fmt.Sscanf(string(text), "goroutine profile: total %d", &m.goroutines)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
	if err != nil {
		return m, err
	}
	m.rss, err = vmRSS(string(b))
	return m, err
}

// quiet waits until the process used less than share of one CPU over a second, and returns
// how long that took; after timeout it gives up waiting and returns the timeout.
func (p proc) quiet(ctx context.Context, share float64, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for time.Since(start) < timeout {
		t0, err := p.cpu()
		if err != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
		t1, err := p.cpu()
		if err != nil {
			return 0, err
		}
		if (t1 - t0).Seconds() < share {
			return time.Since(start), nil
		}
	}
	return timeout, nil
}

// loadAverage is the machine's 1-minute load average (other work on the machine skews every
// number here); 0 when unknown.
func loadAverage() float64 {
	var l float64
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscanf(string(b), "%f", &l)
	}
	return l
}

// cpu is the process's user+system time so far.
func (p proc) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		return 0, err
	}
	return cpuTime(string(b))
}

// cpuTime is a /proc/PID/stat line's utime+stime (benchenv.StatCPU).
func cpuTime(stat string) (time.Duration, error) {
	self, _, err := benchenv.StatCPU(stat)
	return self, err
}

// vmRSS reads VmRSS from /proc/PID/status, in bytes.
func vmRSS(status string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS line")
}

// heapInUse sums "# HeapInuse = N" and the first number of "# Stack = N / M" from a heap
// profile in text form (debug=1): the Go memory the parked polls hold, goroutine stacks
// included.
func heapInUse(profile string) (int64, error) {
	var heap, stack int64 = -1, -1
	sc := bufio.NewScanner(strings.NewReader(profile))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "# HeapInuse = "); ok {
			heap, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "# Stack = "); ok {
			stack, _ = strconv.ParseInt(strings.TrimSpace(strings.SplitN(v, "/", 2)[0]), 10, 64)
		}
	}
	if heap < 0 || stack < 0 {
		return 0, fmt.Errorf("heap profile has no HeapInuse/Stack lines")
	}
	return heap + stack, nil
}
