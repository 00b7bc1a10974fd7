package output

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Cell formatting shared by the tables, so every command shows absent values, times, money
// and durations the same way.

// Dash shows an empty string as "-".
func Dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// IntPtr shows a nil *int as "-".
func IntPtr(p *int) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(*p)
}

// Ints joins integers with commas ("-" when empty).
func Ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return Dash(strings.Join(s, ","))
}

// Money shows an amount in minor units (cents) as "12.34 USD".
func Money(minor int64, currency string) string {
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	return strings.TrimSpace(fmt.Sprintf("%s%d.%02d %s", sign, minor/100, minor%100, currency))
}

// Time shows a timestamp in UTC, to the second.
func Time(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// TimePtr shows a nil *time.Time as "-".
func TimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return Time(*t)
}

// Millis shows a duration given in milliseconds.
func Millis(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }

// Short is an id's last 8 hex digits: the random tail of a time-ordered (v7) id, so two rows
// made in the same minute still differ (their first 8 characters, the time, do not).
// Every command that takes an id accepts it (cmdutil.ResolveID).
func Short(id string) string {
	hex := strings.ReplaceAll(id, "-", "")
	if len(hex) > 8 {
		return hex[len(hex)-8:]
	}
	return id
}
