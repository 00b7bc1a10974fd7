package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/bench/provision"
)

// provisionSuite is issue 9 item 5: allocation commit -> first phase started on the host.
type provisionSuite struct {
	Result provision.Result `json:"result"`
}

func runProvision(ctx context.Context, work, bin string, quick bool) (*provisionSuite, error) {
	hosts, allocs := 13, 100 // 104 slots: every allocation fits at once
	if quick {
		hosts, allocs = 4, 30
	}
	env, err := benchenv.Start(ctx, benchenv.Options{Dir: filepath.Join(work, "provision"), BinDir: bin})
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	fmt.Printf("provision: enrolling %d sim hosts (discover + approve each)...\n", hosts)
	fleet, err := provision.Start(ctx, env, bin, hosts)
	if err != nil {
		return nil, err
	}
	defer fleet.Stop()
	r, err := fleet.Burst(ctx, allocs)
	if err != nil {
		return nil, err
	}
	fmt.Printf("provision: %d allocations on %d hosts: queued p50 %.0f ms p99 %.0f ms; first phase p50 %.0f ms p99 %.0f ms max %.0f ms; active p50 %.0f ms p99 %.0f ms; failed %d\n",
		r.Allocations, r.Hosts, r.QueuedP50ms, r.QueuedP99ms, r.FirstPhaseP50ms, r.FirstPhaseP99ms, r.FirstPhaseMaxms, r.ActiveP50ms, r.ActiveP99ms, r.Failed)
	return &provisionSuite{Result: r}, nil
}

func (s *provisionSuite) markdown() string {
	r := s.Result
	var b strings.Builder
	fmt.Fprintf(&b, "## Provisioning overhead (item 5)\n\n%d one-GPU allocations created at the same instant (one HTTPS client each) on %d enrolled `gpuaas-hostd` processes (sim runtime: the VM is simulated, %d ms per phase; enrollment, mTLS long polls, signed tasks, progress and results are real). Each client has connected (TLS handshake) before the burst. Measured from the allocation's commit (its `created_at`: the clock at the allocation's insert, the last statement before commit) to the start of the first of the 17 phases recorded by the host, both on this machine's clock; task queued is the start of the outbox worker's transaction that turned the event into the host task.\n\n", r.Allocations, r.Hosts, r.SimPhaseDelayMS)
	b.WriteString("| allocations | hosts | commit→task queued p50 ms | p99 ms | commit→first phase p50 ms | p99 ms | max ms | commit→active p50 ms | p99 ms | failed | released after |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d |\n\n", r.Allocations, r.Hosts, r.QueuedP50ms, r.QueuedP99ms, r.FirstPhaseP50ms, r.FirstPhaseP99ms, r.FirstPhaseMaxms, r.ActiveP50ms, r.ActiveP99ms, r.Failed, r.ReleasedVerified)
	fmt.Fprintf(&b, "- target: commit→first phase p99 <= 1 s: %s.\n", verdict(r.FirstPhaseP99ms > 0 && r.FirstPhaseP99ms <= 1000 && r.Failed == 0))
	b.WriteString("- commit→active includes the 17 simulated phases; a host runs up to 8 tasks at once.\n")
	b.WriteString("- The lab VM's real phase timings (UEFI boot under QEMU emulation, DHCP, readiness) are printed by `make demo` on a machine with libvirt; they are dominated by emulated boot, not by the control plane.\n")
	return b.String()
}
