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
}

// Sub is c - o, component by component.
func (c CPU) Sub(o CPU) CPU {
	return CPU{Controller: c.Controller - o.Controller, Postgres: c.Postgres - o.Postgres, Self: c.Self - o.Self}
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
	self, reaped, err := procCPU(pm)
	if err != nil {
		return c, fmt.Errorf("postmaster: %w", err)
	}
	c.Postgres = self + reaped // exited backends' time is added to the postmaster's when it reaps them
	kids, err := children(pm)
	if err != nil {
		return c, err
	}
	for _, k := range kids {
		if t, _, err := procCPU(k); err == nil { // a backend may exit meanwhile: then it is in reaped next time
			c.Postgres += t
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return c, err
	}
	c.Self = RusageCPU(&ru)
	return c, nil
}

// RusageCPU is user + system time of a rusage (e.g. a finished pgbench's SysUsage).
func RusageCPU(ru *syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU returns a process's own CPU time and that of its reaped children.
func procCPU(pid int) (self, reaped time.Duration, err error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
	n := func(i int) time.Duration {
		v, _ := strconv.ParseInt(f[i-3], 10, 64)
		return time.Duration(v) * clockTick
	}
	return n(14) + n(15), n(16) + n(17), nil
}

// procStat returns /proc/PID/stat's fields from the state on (field 3), the command name
// (which may hold spaces and parentheses) cut off.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
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
		f, err := procStat(p)
		if err != nil {
			continue
		}
		if pp, _ := strconv.Atoi(f[1]); pp == pid {
			out = append(out, p)
		}
	}
	return out, nil
}
