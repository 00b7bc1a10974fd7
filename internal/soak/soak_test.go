package soak

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
)

// binaries builds the three commands into a temporary directory (SOAK_BIN reuses a build).
func binaries(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("SOAK_BIN"); dir != "" {
		return dir
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "../../cmd/gpuaas-controller", "../../cmd/gpuaas-hostd", "../../cmd/gpuaasctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// workDir is a directory the embedded PostgreSQL (run as an unprivileged user when we are
// root) can traverse.
func workDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpuaas-soak-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() || os.Getenv("SOAK_KEEP") == "" {
			os.RemoveAll(dir)
		}
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSoak is the load soak: 64 clients against 200 enrolled sim hosts with random kill -9
// of hostd. `make test` runs the short variant; `make soak` sets SOAK_DURATION=30m.
// SOAK_HOSTS, SOAK_CLIENTS, SOAK_KILL_EVERY and SOAK_REPORT (a directory) adjust it.
func TestSoak(t *testing.T) {
	pgtest.RequireServer(t)
	if testing.Short() {
		t.Skip("the soak takes minutes (-short)")
	}
	o := Options{Dir: workDir(t), BinDir: binaries(t), Duration: envDuration(t, "SOAK_DURATION", 3*time.Minute),
		KillEvery: envDuration(t, "SOAK_KILL_EVERY", 0), Hosts: envInt(t, "SOAK_HOSTS"), Clients: envInt(t, "SOAK_CLIENTS"), Logf: t.Logf}
	ctx, cancel := context.WithTimeout(context.Background(), o.Duration+15*time.Minute)
	defer cancel()
	rep, err := Run(ctx, o)
	out := os.Getenv("SOAK_REPORT")
	if out == "" {
		out = filepath.Join(o.Dir, "report")
	}
	text, werr := rep.Write(out)
	t.Logf("report (%s):\n%s", out, text)
	if werr != nil {
		t.Errorf("writing the report: %v", werr)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

func envInt(t *testing.T, name string) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

func TestParseMetrics(t *testing.T) {
	s, err := parseMetrics(strings.NewReader("# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 412\ngo_goroutines_other 1\nprocess_resident_memory_bytes 5.0331648e+07\n"))
	if err != nil || s.goroutines != 412 || s.rss != 50331648 {
		t.Fatalf("parseMetrics = %+v, %v", s, err)
	}
	if _, err := parseMetrics(strings.NewReader("go_goroutines 3\n")); err == nil {
		t.Fatal("no error without process_resident_memory_bytes")
	}
}
