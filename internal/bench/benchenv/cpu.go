package benchenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU is CPU time (user + system) consumed so far by the parts of a benchmark run, read from
// /proc: on a 2-core machine a rate is bounded by the CPU one operation costs, so this says
// which process a ratio is lost in.
type CPU struct {
	Controller time.Duration // the gpuaas-controller process
	Postgres   time.Duration // the postmaster, its live backends and every backend that exited
	Self       time.Duration // this process (the API load generator's clients)
	// Busy and Idle are the whole machine's CPU time, every core: busy (user, nice, system,
	// irq, softirq) and idle (idle, iowait), from /proc/stat. Busy less the parts above is what
	// a run does not measure: the other fleet's database and controller, the kernel's work
	// charged to no process, anything else running here.
	Busy, Idle time.Duration
}

// Sub is c - o, component by component.
func (c CPU) Sub(o CPU) CPU {
	return CPU{Controller: c.Controller - o.Controller, Postgres: c.Postgres - o.Postgres, Self: c.Self - o.Self,
		Busy: c.Busy - o.Busy, Idle: c.Idle - o.Idle}
}

// MachineCPU reads the machine's busy and idle CPU time (all cores) from /proc/stat.
func MachineCPU() (busy, idle time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	return ProcStatCPU(string(b))
}

// ProcStatCPU parses /proc/stat's first line ("cpu  user nice system idle iowait irq softirq
// steal ...", USER_HZ ticks): busy is user+nice+system+irq+softirq, idle is idle+iowait
// (steal is time the hypervisor gave elsewhere: neither).
func ProcStatCPU(stat string) (busy, idle time.Duration, err error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %.60q", line)
	}
	var v [7]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/stat field %d: %w", i+1, err)
		}
	}
	tick := func(n int64) time.Duration { return time.Duration(n) * clockTick }
	return tick(v[0] + v[1] + v[2] + v[5] + v[6]), tick(v[3] + v[4]), nil
}

// clockTick is USER_HZ, the unit of /proc/PID/stat times (100 on every Linux architecture Go
// supports).
const clockTick = 10 * time.Millisecond

// CPUNow reads the controller's, PostgreSQL's and this process's CPU time.
func (e *Env) CPUNow() (CPU, error) {
	var c CPU
	var err error
	if c.Controller, _, err = procCPU(e.PID()); err != nil {
		return c, fmt.Errorf("controller: %w", err)
	}
	pm, err := e.PG.PID()
	if err != nil {
		return c, err
	}
	if c.Postgres, err = postgresCPU(pm); err != nil {
		return c, err
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return c, err
	}
	c.Self = RusageCPU(&ru)
	if c.Busy, c.Idle, err = MachineCPU(); err != nil {
		return c, err
	}
	return c, nil
}

// postgresCPU is the postmaster's CPU time, its children's (live or exited and not yet
// reaped: a zombie's /proc entry keeps its times) and every child it reaped (its cutime and
// cstime). A child reaped while its siblings are read is in neither reading: when the
// postmaster's reaped time moved during the scan, the scan is read again. (Without this, a
// read just as pgbench's 16 backends exited counted none of them: 0.05 ms of PostgreSQL CPU
// per pair instead of 2.)
func postgresCPU(pm int) (time.Duration, error) {
	for try := 0; ; try++ {
		_, reaped0, err := procCPU(pm)
		if err != nil {
			return 0, fmt.Errorf("postmaster: %w", err)
		}
		kids, err := children(pm)
		if err != nil {
			return 0, err
		}
		var sum time.Duration
		for _, k := range kids {
			if t, _, err := procCPU(k); err == nil { // gone: reaped, so reaped moves and this is read again
				sum += t
			}
		}
		self, reaped, err := procCPU(pm)
		if err != nil {
			return 0, fmt.Errorf("postmaster: %w", err)
		}
		if reaped == reaped0 || try == 20 {
			return self + reaped + sum, nil
		}
	}
}

// RusageCPU is user + system time of a rusage (e.g. a finished pgbench's SysUsage).
func RusageCPU(ru *syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU returns a process's own CPU time and that of its reaped children.
func procCPU(pid int) (self, reaped time.Duration, err error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	return StatCPU(string(b))
}

// StatCPU reads a /proc/PID/stat line's utime+stime and cutime+cstime (fields 14-17, in
// USER_HZ ticks); the command name, field 2, may hold spaces and parentheses, so fields
// count from its last ')'.
func StatCPU(stat string) (self, reaped time.Duration, err error) {
	f, err := statFields(stat)
	if err != nil {
		return 0, 0, err
	}
	n := func(i int) (time.Duration, error) {
		v, err := strconv.ParseInt(f[i-3], 10, 64)
		return time.Duration(v) * clockTick, err
	}
	var t [4]time.Duration
	for k := range t {
		if t[k], err = n(14 + k); err != nil {
			return 0, 0, fmt.Errorf("stat field %d: %w", 14+k, err)
		}
	}
	return t[0] + t[1], t[2] + t[3], nil
}

// statFields returns a stat line's fields from the state on (field 3).
func statFields(stat string) ([]string, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, fmt.Errorf("stat: no command name in %.40q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 15 {
		return nil, fmt.Errorf("stat: %d fields", len(f))
	}
	return f, nil
}

// children lists the live processes whose parent is pid.
func children(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f, err := statFields(string(b))
		if err != nil {
			continue
		}
		if pp, _ := strconv.Atoi(f[1]); pp == pid {
			out = append(out, p)
		}
	}
	return out, nil
}
