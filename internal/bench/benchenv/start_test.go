package benchenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A controller that exits while starting (a failed migration, a bad flag) is an error that
// carries its log, and stopping the environment afterwards returns at once: the exit was
// reaped by the start, and nothing may wait for it again.
func TestControllerThatExitsAtStartIsReaped(t *testing.T) {
	dir, bin := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "gpuaas-controller"), []byte("#!/bin/sh\necho 'migrate: deadlock detected'\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := &Env{Dir: dir, StateDir: filepath.Join(dir, "state")}
	err := e.StartController(context.Background(), bin)
	if err == nil || !strings.Contains(err.Error(), "deadlock detected") {
		t.Fatalf("start of a controller that exits: %v; want its log in the error", err)
	}
	stopped := make(chan struct{})
	go func() { e.StopController(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second): // StopController's own SIGKILL fallback is 20 s
		t.Fatal("StopController waits for a controller whose exit the start already reaped")
	}
}
