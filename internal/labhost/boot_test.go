package labhost

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// TestBootProbe boots the lab host and prints what its kernel sees (GPUAAS_LAB_HOST=1, root).
func TestBootProbe(t *testing.T) {
	if os.Getenv("GPUAAS_LAB_HOST") != "1" {
		t.Skip("GPUAAS_LAB_HOST=1 boots the lab host VM (make lab-host)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	img, built, err := Ensure(ctx, hostfs.Exec{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s (built now: %v)", img.RootFS, built)
	t0 := time.Now()
	m, err := Boot(ctx, img, DefaultLayout(), BootOptions{Dir: t.TempDir(), Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	t.Logf("up in %s", time.Since(t0))
	out, err := m.Exec(ctx, os.Getenv("PROBE"))
	t.Logf("%s (%v)", out, err)
}
