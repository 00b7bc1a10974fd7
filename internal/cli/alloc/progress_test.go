package alloc

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func TestPhaseLogLiveStatusLine(t *testing.T) {
	var b bytes.Buffer
	p := &phaseLog{w: &b, live: true, start: time.Now()}
	tk := apiv1.AllocationTask{Type: "slice.vm_provision", Attempt: 1, Phases: []apiv1.TaskPhase{
		{Name: "lease_acquire", Status: "ok"}, {Name: "host_dependencies", Status: "ok"}, {Name: "host_passthrough_check", Status: "skipped"},
		{Name: "vfio_bind_check", Status: "skipped"}, {Name: "image_stat_download", Status: "running", Detail: "50 of 100 MiB (50%)"},
	}}
	p.progress(tk)
	out := b.String()
	if !strings.Contains(out, "slice.vm_provision #1 [████░░░░░░░░░░░░░░░░] 4/17 image_stat_download 50 of 100 MiB (50%)") {
		t.Fatalf("status line %q", out)
	}
	b.Reset()
	p.line("[   1.0s] slice.vm_provision #1 vfio_bind_check skipped")
	if out := b.String(); !strings.HasPrefix(out, "\r\x1b[K[   1.0s]") || !strings.Contains(out, "\n\r\x1b[K") {
		t.Fatalf("a finished phase must clear the status line, print, and redraw it: %q", out)
	}
	b.Reset()
	p.close()
	if b.String() != "\r\x1b[K" {
		t.Fatalf("close %q", b.String())
	}

	// Not a terminal: plain lines only, no status line.
	b.Reset()
	plain := &phaseLog{w: &b, start: time.Now()}
	plain.progress(tk)
	plain.line("x")
	plain.close()
	if b.String() != "x\n" {
		t.Fatalf("plain output %q", b.String())
	}
}
