package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestDemoIsATightStory runs `make demo`'s sim path end to end on freshly built binaries and
// holds it to what a newcomer reads: it succeeds; no step is longer than a screen; the
// allocation is shown once as the tenant and once as the operator (no repeats, no page of
// JSON, no "waiting for the host daemon" after --wait succeeded); sim phase lines say
// simulated, never ok; the release ends with the tenant's handover summary.
func TestDemoIsATightStory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the whole demo")
	}
	if _, err := exec.LookPath("pg_ctl"); err != nil {
		if matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl"); len(matches) == 0 {
			t.Skip("PostgreSQL server binaries are needed (make deps installs them)")
		}
	}
	bin := t.TempDir()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := exec.Command(goTool, "build", "-o", bin+"/", "../../cmd/gpuaasctl", "../../cmd/gpuaas-hostd", "../../cmd/gpuaas-controller", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "demo"), "--bin", bin, "--sim").CombinedOutput()
	text := string(out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, text)
	}
	const screen = 65
	step, lines := "", 0
	check := func() {
		if step != "" && lines > screen {
			t.Errorf("step %q prints %d lines: more than a screen (%d)", step, lines, screen)
		}
	}
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "== ") {
			check()
			step, lines = l, 0
			continue
		}
		lines++
	}
	check()
	if n := strings.Count(text, "$ gpuaasctl alloc show "); n > 3 {
		t.Errorf("alloc show runs %d times: the tenant's view, the operator's and the release's are enough", n)
	}
	if strings.Contains(text, "waiting for the host daemon") {
		t.Error("the demo says it waits for the host after alloc create --wait already waited")
	}
	if regexp.MustCompile(`(?m)^\[\s*[0-9.]+s\] slice\.vm_\w+ #\d+ \w+\s+ok\s`).MatchString(text) {
		t.Error("a sim phase line says ok")
	}
	if !strings.Contains(text, `"handover":"2 disks simulated`) {
		t.Error("the release does not end with the tenant's handover summary")
	}
}
