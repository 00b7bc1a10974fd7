package agent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cloudinit"
	"github.com/gpuaas/gpuaas/internal/slicevm"
	"github.com/gpuaas/gpuaas/internal/task"
)

// validationRun runs the validation VM's script exactly as the seed carries it, with the guest
// commands it may call (nvidia-smi, dcgmi) given as stand-in scripts (a guest GPU cannot exist
// here) and curl recording the report it posts, and returns the checks hostd makes of it.
func validationRun(t *testing.T, tools map[string]string) []apiv1.ValidationCheck {
	t.Helper()
	f, err := cloudinit.Render(cloudinit.Seed{InstanceID: "validate-s1", Hostname: "gpuaas-validate", Username: "debian",
		MAC: "52:54:00:0a:05:00", TelemetryToken: "gpt_abc", TelemetryURL: "http://10.100.5.1:9110/internal/v1/guest-telemetry", Validation: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(f.UserData), "/usr/local/bin/gpuaas-validate") || f.Validate == nil {
		t.Fatal("the validation seed carries no validation script")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	posted := filepath.Join(dir, "posted")
	tools["curl"] = `while [ $# -gt 0 ]; do [ "$1" = --data ] && printf '%s' "$2" > "` + posted + `"; shift; done`
	for name, body := range tools {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(dir, "validate")
	if err := os.WriteFile(script, f.Validate, 0o755); err != nil {
		t.Fatal(err)
	}
	// Only the stand-ins and the basic tools: this machine's own nvidia-smi, if any, is not used.
	for _, tool := range []string{"sh", "tr", "cut", "grep", "head", "tail", "sleep", "cat"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(bin, "sh"), script)
	cmd.Env = []string{"PATH=" + bin}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("validation script: %v\n%s", err, out)
	}
	body, err := os.ReadFile(posted)
	if err != nil {
		t.Fatal(err)
	}
	checks, err := GuestValidationChecks(body)
	if err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return checks
}

func checkOf(t *testing.T, cs []apiv1.ValidationCheck, name string) apiv1.ValidationCheck {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, cs)
	return apiv1.ValidationCheck{}
}

// A guest without a GPU (the lab's test guest) reports "no GPU here": a pass only as
// simulated, never ok; dcgmi absent is skipped.
func TestValidationVMWithoutAGPUSaysNoGPUHere(t *testing.T) {
	cs := validationRun(t, map[string]string{})
	if c := checkOf(t, cs, "guest nvidia-smi"); !c.Passed || !c.Simulated || !strings.Contains(c.Detail, "no GPU here") {
		t.Fatalf("nvidia-smi without a GPU: %+v", c)
	}
	if c := checkOf(t, cs, "guest dcgmi diag -r 1"); !c.Passed || c.Simulated || !c.Skipped || !strings.Contains(c.Detail, "not installed") {
		t.Fatalf("dcgmi not installed: %+v", c)
	}
}

// A guest whose GPU answers passes nvidia-smi; a failing `dcgmi diag -r 1` fails the
// validation, and so does an nvidia-smi that cannot reach its GPU.
func TestValidationVMReportsGPUAndDCGMResults(t *testing.T) {
	cs := validationRun(t, map[string]string{
		"nvidia-smi": `echo "GPU 0: NVIDIA H200 (UUID: GPU-9b1c2a4e-0000-0000-0000-000000000000)"`,
		"dcgmi":      `echo "| Memory | Fail - GPU 0 had an uncorrectable memory error"; exit 226`,
	})
	if c := checkOf(t, cs, "guest nvidia-smi"); !c.Passed || c.Simulated || !strings.Contains(c.Detail, "1 GPU(s)") {
		t.Fatalf("nvidia-smi with a GPU: %+v", c)
	}
	if c := checkOf(t, cs, "guest dcgmi diag -r 1"); c.Passed || !strings.Contains(c.Detail, "uncorrectable memory error") {
		t.Fatalf("a failing dcgmi diag: %+v", c)
	}
	cs = validationRun(t, map[string]string{"nvidia-smi": `echo "Unable to determine the device handle for GPU0000:00:06.0: Unknown Error"; exit 15`})
	if c := checkOf(t, cs, "guest nvidia-smi"); c.Passed || !strings.Contains(c.Detail, "Unknown Error") {
		t.Fatalf("an nvidia-smi that fails: %+v", c)
	}
}

// A report hostd cannot read fails the validation rather than passing it.
func TestGuestValidationReportsThatFail(t *testing.T) {
	for body, want := range map[string]string{
		`{"validation": {"checks": []}}`: "no checks",
		`not json`:                       "not JSON",
	} {
		if _, err := GuestValidationChecks([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v", body, err)
		}
	}
	if _, err := GuestValidationChecks([]byte(`{"loadavg": "0 0 0"}`)); err != errNoValidation {
		t.Fatalf("a plain telemetry report: %v", err)
	}
	cs, err := GuestValidationChecks([]byte(`{"validation": {"checks": [{"name": "x", "result": "ok"}]}}`))
	if err != nil || len(cs) != 1 || cs[0].Passed {
		t.Fatalf("an unknown result: %+v %v", cs, err)
	}
}

// The sim runtime boots no validation VM and says so (simulated); a plan that is not the
// slot's own (another slot's bundle, or not marked as a validation VM) boots nothing and
// fails the validation.
func TestBurnInOnSimAndForeignPlans(t *testing.T) {
	a := &Agent{runtime: slicevm.Sim{}}
	own := func() *task.SlotValidate {
		return &task.SlotValidate{SlotID: "s1", Level: "burn-in", GPUPCI: "0000:1b:00.0", FabricVF: "0000:1a:00.2",
			BurnIn: &task.VMProvision{AllocationID: "validate-s1", Validation: true,
				Bundles: []task.Bundle{{SlotID: "s1", GPUPCI: "0000:1b:00.0", FabricVFPCI: "0000:1a:00.2"}}}}
	}
	cs := a.burnIn(context.Background(), own(), &slicevm.Recorder{})
	if len(cs) != 1 || !cs[0].Passed || !cs[0].Simulated || !strings.Contains(cs[0].Detail, "no VM booted") {
		t.Fatalf("sim burn-in: %+v", cs)
	}
	for name, edit := range map[string]func(*task.SlotValidate){
		"another slot's bundle": func(p *task.SlotValidate) { p.BurnIn.Bundles[0].SlotID = "s2" },
		"another GPU":           func(p *task.SlotValidate) { p.BurnIn.Bundles[0].GPUPCI = "0000:3c:00.0" },
		"two bundles":           func(p *task.SlotValidate) { p.BurnIn.Bundles = append(p.BurnIn.Bundles, p.BurnIn.Bundles[0]) },
		"not a validation VM":   func(p *task.SlotValidate) { p.BurnIn.Validation = false },
		"a tenant's allocation": func(p *task.SlotValidate) { p.BurnIn.AllocationID = "a-tenant" },
		"no plan":               func(p *task.SlotValidate) { p.BurnIn = nil },
	} {
		p := own()
		edit(p)
		if cs := a.burnIn(context.Background(), p, &slicevm.Recorder{}); len(cs) != 1 || cs[0].Passed {
			t.Fatalf("%s: %+v", name, cs)
		}
	}
}
