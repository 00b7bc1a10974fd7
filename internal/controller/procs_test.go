package controller

import (
	"runtime"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestMaxProcsChoice(t *testing.T) {
	auto, _ := parseMaxProcs("auto")
	all, _ := parseMaxProcs("all")
	three, _ := parseMaxProcs("3")
	for _, c := range []struct {
		name          string
		choice        procsChoice
		goDefault     int
		envSet, local bool
		want          int
		whyContains   string
	}{
		{"local database, 2 CPUs: one left to it", auto, 2, false, true, 1, "PostgreSQL runs on this machine"},
		{"local database, 16 CPUs", auto, 16, false, true, 8, "half"},
		{"local database, 1 CPU: never 0", auto, 1, false, true, 1, "half"},
		{"remote database: the runtime's choice", auto, 16, false, false, 0, "elsewhere"},
		{"all", all, 16, false, true, 0, "every CPU"},
		{"a count", three, 16, false, true, 3, "--max-procs"},
		{"GOMAXPROCS wins over a count", three, 16, true, true, 0, "GOMAXPROCS"},
		{"GOMAXPROCS wins over auto", auto, 16, true, true, 0, "GOMAXPROCS"},
	} {
		got, why := maxProcs(c.choice, c.goDefault, c.envSet, c.local)
		if got != c.want || !strings.Contains(why, c.whyContains) {
			t.Errorf("%s: %d (%s), want %d (%q)", c.name, got, why, c.want, c.whyContains)
		}
	}
}

func TestMaxProcsFlag(t *testing.T) {
	for _, bad := range []string{"0", "-1", "half", "4097", "1.5"} {
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		bindFlags(fs, "max-procs")
		if err := fs.Parse([]string{"--max-procs", bad}); err != nil {
			t.Fatal(err)
		}
		if _, err := loadConfig(fs); err == nil || !strings.Contains(err.Error(), "--max-procs") {
			t.Errorf("--max-procs %s: %v, want a --max-procs error", bad, err)
		}
	}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	bindFlags(fs, "max-procs")
	if cfg, err := loadConfig(fs); err != nil || cfg.MaxProcs != "auto" {
		t.Fatalf("default: %q %v", cfg.MaxProcs, err)
	}
}

// applyMaxProcs changes the runtime's setting: a count sticks, the GOMAXPROCS variable leaves it.
func TestApplyMaxProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	before := runtime.GOMAXPROCS(0)
	if n, _ := applyMaxProcs(procsChoice{n: 1}, "postgres://db.example/x", false); n != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("a count of 1: in force %d", runtime.GOMAXPROCS(0))
	}
	runtime.GOMAXPROCS(before)
	if n, why := applyMaxProcs(procsChoice{n: 1}, "", true); n != before || !strings.Contains(why, "GOMAXPROCS") {
		t.Fatalf("with GOMAXPROCS set: %d (%s), want %d untouched", n, why, before)
	}
}
