// Package cpuset parses and formats host CPU sets in the kernel's cpulist form ("0-3,8,10-11",
// as in /sys/devices/system/node/nodeN/cpulist and libvirt's cpuset attributes). A set is a
// sorted slice of distinct CPU numbers; the text form is what the API, the CLI, slot maps and
// task payloads carry, so every side reads and writes it through this one package.
package cpuset

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// MaxCPU bounds CPU numbers accepted from input (Linux's NR_CPUS tops out at 8192).
const MaxCPU = 8191

// Parse reads a cpulist. Whitespace around the list is ignored; an empty list is the empty
// set. Ranges must be ascending, numbers in 0..MaxCPU; duplicates are merged.
func Parse(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	seen := map[int]bool{}
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := cpuNumber(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %v", s, err)
		}
		b := a
		if isRange {
			if b, err = cpuNumber(hi); err != nil {
				return nil, fmt.Errorf("cpu list %q: %v", s, err)
			}
			if b < a {
				return nil, fmt.Errorf("cpu list %q: range %s runs backwards", s, part)
			}
		}
		for c := a; c <= b; c++ {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	sort.Ints(out)
	return out, nil
}

func cpuNumber(s string) (int, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > MaxCPU || s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%q is not a CPU number (0-%d)", s, MaxCPU)
	}
	return n, nil
}

// Format writes a set in cpulist form with ranges collapsed ("0-3,8"); the input need not be
// sorted or distinct.
func Format(cpus []int) string {
	if len(cpus) == 0 {
		return ""
	}
	c := append([]int(nil), cpus...)
	sort.Ints(c)
	var b strings.Builder
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && (c[j+1] == c[j]+1 || c[j+1] == c[j]) {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(c[i]))
		if c[j] != c[i] {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(c[j]))
		}
		i = j + 1
	}
	return b.String()
}

// Overlap returns the CPUs present in both sets, sorted.
func Overlap(a, b []int) []int {
	in := map[int]bool{}
	for _, c := range a {
		in[c] = true
	}
	var out []int
	for _, c := range b {
		if in[c] {
			in[c] = false
			out = append(out, c)
		}
	}
	sort.Ints(out)
	return out
}

// Union returns the sorted, distinct CPUs of all sets.
func Union(sets ...[]int) []int {
	seen := map[int]bool{}
	var out []int
	for _, s := range sets {
		for _, c := range s {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	sort.Ints(out)
	return out
}
