package e2e

import (
	"context"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gpuaas/gpuaas/internal/labguest"
)

// restartLibvirtd stops libvirtd and starts it again (running guests live on), returning
// once its socket answers. Other lab scripts share this libvirtd: only scripts about a
// libvirtd restart use it. Usage: restartlibvirtd
func restartLibvirtd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: restartlibvirtd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ts.Check(labguest.RestartLibvirtd(ctx))
}
