package firmware

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// idrac is a SCRIPTED STAND-IN for RACADM and the reboot: RACADM and an iDRAC cannot exist on
// these machines (a named fake boundary). It keeps BIOS attributes, stages `set` values until a
// "reboot", and can be told to ignore staged values (firmware that will not take them).
type idrac struct {
	bios     map[string]string
	pending  map[string]string
	stubborn bool
	calls    []string
	reboots  int
}

func newIdrac(bios map[string]string) *idrac {
	return &idrac{bios: bios, pending: map[string]string{}}
}

func (d *idrac) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	d.calls = append(d.calls, name+" "+strings.Join(args, " "))
	switch {
	case name == "racadm" && len(args) == 2 && args[0] == "get":
		v, ok := d.bios[args[1]]
		if !ok {
			return nil, &hostfs.ExitError{Cmd: "racadm get", Code: 1, Stderr: "ERROR: invalid attribute"}
		}
		short := args[1][strings.LastIndex(args[1], ".")+1:]
		return []byte(fmt.Sprintf("[Key=BIOS.Setup.1-1#%s]\n%s=%s\n", "Group", short, v)), nil
	case name == "racadm" && len(args) == 3 && args[0] == "set":
		d.pending[args[1]] = args[2]
		return []byte("Object value modified successfully\n"), nil
	case name == "racadm" && len(args) == 3 && args[0] == "jobqueue":
		return []byte("Commit JID = JID_001\n"), nil
	case name == "systemctl" && len(args) == 1 && args[0] == "reboot":
		d.reboots++
		return nil, nil
	}
	return nil, fmt.Errorf("stand-in: unexpected command %s %v", name, args)
}

// reboot applies staged values (unless stubborn).
func (d *idrac) reboot() {
	if !d.stubborn {
		for k, v := range d.pending {
			d.bios[k] = v
		}
	}
	d.pending = map[string]string{}
}

const attrs = "BIOS.ProcSettings.ProcVirtualization=Enabled BIOS.ProcSettings.LogicalProc=Enabled BIOS.IntegratedDevices.SriovGlobalEnable=Enabled"

func env(m map[string]string) func(string) string {
	base := map[string]string{"GPUAAS_FIRMWARE_PROFILE_TAG": TagSliceVM, "GPUAAS_FIRMWARE_PROFILE_VERSION": "h200-xe9680l-slice-vm-v1",
		"GPUAAS_FIRMWARE_APPLY_IF_NEEDED": "1", "GPUAAS_FIRMWARE_REBOOT_ON_CHANGE": "1", "GPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS": "1",
		"GPUAAS_FIRMWARE_EXPECTED_BIOS_ATTRS": attrs, "GPUAAS_NODE_TAGS": TagSliceVM + ",gpu-nvidia-h200"}
	for k, v := range m {
		base[k] = v
	}
	return func(k string) string { return base[k] }
}

func drifted() map[string]string {
	return map[string]string{"BIOS.ProcSettings.ProcVirtualization": "Disabled", "BIOS.ProcSettings.LogicalProc": "Enabled",
		"BIOS.IntegratedDevices.SriovGlobalEnable": "Disabled"}
}

func TestDriftIsStagedRebootedAndVerified(t *testing.T) {
	p, err := ProfileFromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	d := newIdrac(drifted())
	h := Helper{Run: d, Dir: t.TempDir()}
	e, err := h.Apply(context.Background(), p)
	if err == nil || e.Status != StatusPending || e.RebootAttempts != 1 || d.reboots != 1 || len(e.Drift) != 2 {
		t.Fatalf("first boot: %v %+v reboots=%d", err, e, d.reboots)
	}
	if d.pending["BIOS.ProcSettings.ProcVirtualization"] != "Enabled" || d.pending["BIOS.ProcSettings.LogicalProc"] != "" {
		t.Fatalf("staged %v: only drifted attributes are set", d.pending)
	}
	d.reboot()
	e, err = h.Apply(context.Background(), p)
	if err != nil || e.Status != StatusVerified || d.reboots != 1 {
		t.Fatalf("after the reboot: %v %+v", err, e)
	}
	// Verified and cached: the next run touches nothing.
	d.calls = nil
	if e, err := h.Apply(context.Background(), p); err != nil || e.Status != StatusVerified || len(d.calls) != 0 || !strings.Contains(e.Message, "cached") {
		t.Fatalf("cached run: %v %+v calls %v", err, e, d.calls)
	}
	// The evidence hostd reports: profile, version, status.
	b, _ := os.ReadFile(h.EvidencePath())
	for _, want := range []string{`"profile_tag": "gpuaas-profile-slice-vm"`, `"version": "h200-xe9680l-slice-vm-v1"`, `"status": "verified"`} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("evidence lacks %s:\n%s", want, b)
		}
	}
	// A new profile version starts over: it is checked again.
	p2, _ := ProfileFromEnv(env(map[string]string{"GPUAAS_FIRMWARE_PROFILE_VERSION": "v2"}))
	d.calls = nil
	if e, err := h.Apply(context.Background(), p2); err != nil || e.Version != "v2" || len(d.calls) != 3 {
		t.Fatalf("new version: %v %+v calls %v", err, e, d.calls)
	}
}

func TestStubbornFirmwareFailsAfterTheRebootBudget(t *testing.T) {
	p, _ := ProfileFromEnv(env(nil))
	d := newIdrac(drifted())
	d.stubborn = true
	h := Helper{Run: d, Dir: t.TempDir()}
	_, _ = h.Apply(context.Background(), p)
	d.reboot()
	e, err := h.Apply(context.Background(), p)
	if err == nil || e.Status != StatusFailed || d.reboots != 1 || !strings.Contains(e.Message, "after 1 controlled reboot") {
		t.Fatalf("stubborn: %v %+v reboots=%d", err, e, d.reboots)
	}
}

func TestNoApplyAndBlockedAndBadEnv(t *testing.T) {
	p, _ := ProfileFromEnv(env(map[string]string{"GPUAAS_FIRMWARE_APPLY_IF_NEEDED": "0"}))
	d := newIdrac(drifted())
	h := Helper{Run: d, Dir: t.TempDir()}
	if e, err := h.Apply(context.Background(), p); err == nil || e.Status != StatusMismatch || len(d.pending) != 0 {
		t.Fatalf("apply disabled: %v %+v", err, e)
	}
	both, _ := ProfileFromEnv(env(map[string]string{"GPUAAS_NODE_TAGS": TagSliceVM + "," + TagBaremetal}))
	d2 := newIdrac(drifted())
	h2 := Helper{Run: d2, Dir: t.TempDir()}
	if e, err := h2.Apply(context.Background(), both); err == nil || e.Status != StatusBlocked || len(d2.calls) != 0 {
		t.Fatalf("both tags: %v %+v calls %v", err, e, d2.calls)
	}
	for name, m := range map[string]map[string]string{
		"tag":     {"GPUAAS_FIRMWARE_PROFILE_TAG": "gpuaas-profile-other"},
		"version": {"GPUAAS_FIRMWARE_PROFILE_VERSION": "v1; reboot"},
		"attr":    {"GPUAAS_FIRMWARE_EXPECTED_BIOS_ATTRS": "ProcVirtualization=Enabled"},
		"value":   {"GPUAAS_FIRMWARE_EXPECTED_BIOS_ATTRS": "BIOS.A.B=$(reboot)"},
		"reboots": {"GPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS": "9"},
		"none":    {"GPUAAS_FIRMWARE_EXPECTED_BIOS_ATTRS": ""},
	} {
		if _, err := ProfileFromEnv(env(m)); err == nil {
			t.Errorf("%s: bad environment accepted", name)
		}
	}
	// RACADM failing is a failure with the reason, recorded.
	d3 := newIdrac(map[string]string{})
	h3 := Helper{Run: d3, Dir: t.TempDir()}
	if e, err := h3.Apply(context.Background(), p); err == nil || e.Status != StatusFailed || !strings.Contains(e.Message, "invalid attribute") {
		t.Fatalf("racadm error: %v %+v", err, e)
	}
}
