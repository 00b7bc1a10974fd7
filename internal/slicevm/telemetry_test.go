package slicevm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/telemetry"
)

// A retried provision (hostd restarted since the attempt that started the guest) keeps the
// guest telemetry token the running guest already carries, and failing does not revoke it;
// reconcile reports when the guest last reported.
func TestRetriedProvisionKeepsTheGuestsTelemetryToken(t *testing.T) {
	h := labHost(t, time.Minute)
	stateDir := filepath.Join(t.TempDir(), "telemetry")
	first, err := telemetry.OpenRegistry(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	p := plan()
	tok, err := first.Register(p.AllocationID) // attempt 1 put it in the guest's seed
	if err != nil {
		t.Fatal(err)
	}
	// hostd restarts; attempt 2 runs with the registry read back from the state dir.
	if h.cfg.Telemetry, err = telemetry.OpenRegistry(stateDir); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "img.raw")
	if err := os.WriteFile(img, []byte("image"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.Image.SourceRef, p.Image.DigestSHA256 = "file://"+img, digestOf("image")
	rec := &Recorder{TaskID: "t-attempt-2"}
	// The lab bridge "gpuaas-none" does not exist: the attempt fails at runtime_validate,
	// after registering the token, and runs its cleanup.
	_, err = h.Provision(context.Background(), p, rec)
	if err == nil || !strings.Contains(err.Error(), "runtime_validate") {
		t.Fatalf("attempt 2 should fail at runtime_validate: %v (phases %+v)", err, rec.Phases())
	}
	srv := httptest.NewServer(h.cfg.Telemetry.Handler())
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/internal/v1/guest-telemetry", strings.NewReader(`{"gpu_util": 1}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("the running guest's token after a failed retry: %s", resp.Status)
	}
	if again, _ := h.cfg.Telemetry.Register(p.AllocationID); again != tok {
		t.Fatal("the retried provision replaced the guest's token")
	}
	rep, err := h.Reconcile(context.Background(), &task.Reconcile{Allocations: []task.ReconcileAllocation{{AllocationID: p.AllocationID, Status: "active", Bundles: p.Bundles}}})
	if err != nil {
		t.Fatal(err)
	}
	if at := rep.Slots[0].GuestTelemetryAt; at == nil || time.Since(*at) > time.Minute {
		t.Fatalf("reconcile does not report the guest's last telemetry: %v", at)
	}
}

func digestOf(s string) string { d := sha256.Sum256([]byte(s)); return hex.EncodeToString(d[:]) }
