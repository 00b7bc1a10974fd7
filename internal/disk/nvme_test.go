package disk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/task"
)

// fakeNVMeFirmware is a FAKE at the NVMe-firmware boundary (this machine has no NVMe
// controller): it answers nvme-cli commands with nvme-cli's JSON output (testdata/nvme-cli)
// and performs a sanitize or format by zeroing the backing loop device, as a controller's
// erase leaves deallocated blocks reading zero. Every other command (blockdev, blkid,
// wipefs, blkdiscard) runs for real, on the loop device that stands in for /dev/nvme0n1.
type fakeNVMeFirmware struct {
	loop     string // the real device behind /dev/nvme0n1
	idCtrl   map[string]any
	listNS   string // testdata file
	sanitize []string
	mu       sync.Mutex
	calls    []string
	logPolls int
}

func newFakeNVMe(t *testing.T, loop string, sanicap, fna int, listNS string) *fakeNVMeFirmware {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(readTestdata(t, "id-ctrl.json"), &c); err != nil {
		t.Fatal(err)
	}
	c["sanicap"], c["fna"] = sanicap, fna
	return &fakeNVMeFirmware{loop: loop, idCtrl: c, listNS: listNS,
		sanitize: []string{"sanitize-log-running.json", "sanitize-log-done.json"}}
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "nvme-cli", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fakeNVMeFirmware) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	f.calls = append(f.calls, strings.TrimSpace(name+" "+strings.Join(args, " ")))
	f.mu.Unlock()
	if name != "nvme" {
		for i, a := range args {
			if a == "/dev/nvme0n1" {
				args[i] = f.loop
			}
		}
		return hostfs.Exec{}.Run(ctx, name, args...)
	}
	file := func(n string) ([]byte, error) {
		if filepath.IsAbs(n) {
			return os.ReadFile(n)
		}
		return os.ReadFile(filepath.Join("testdata", "nvme-cli", n))
	}
	switch args[0] {
	case "version":
		return []byte("nvme version 2.8 (git 2.8)\nlibnvme version 1.8 (git 1.8)\n"), nil
	case "id-ctrl":
		return json.Marshal(f.idCtrl)
	case "id-ns":
		return file("id-ns.json")
	case "list-ns":
		return file(f.listNS)
	case "sanitize", "format":
		// The controller's erase, simulated: the namespace reads back zero.
		return hostfs.Exec{}.Run(ctx, "blkdiscard", "-z", f.loop)
	case "sanitize-log":
		f.mu.Lock()
		i := min(f.logPolls, len(f.sanitize)-1)
		f.logPolls++
		f.mu.Unlock()
		return file(f.sanitize[i])
	}
	return nil, &hostfs.ExitError{Cmd: "nvme " + strings.Join(args, " "), Code: 1, Stderr: "unexpected command"}
}

func (f *fakeNVMeFirmware) nvmeCalls() []string {
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, "nvme ") && c != "nvme version" {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeNVMeFirmware) ran(prefix string) bool {
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			return true
		}
	}
	return false
}

// nvmeRoot is a host root whose /dev/nvme0n1 is a device node of the loop device (same
// major:minor), with nothing mounted.
func nvmeRoot(t *testing.T, loop string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(loop, &st); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, d := range []string{"dev", "proc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mknod(filepath.Join(root, "dev", "nvme0n1"), syscall.S_IFBLK|0o600, int(st.Rdev)); err != nil {
		t.Skipf("mknod: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc", "mounts"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func dirty(t *testing.T, dev string) {
	t.Helper()
	sh(t, "mkfs.ext4", "-q", "-F", dev)
}

// NVMe branch selection and command sequence, against the fake firmware: each policy and
// controller capability picks its erase, and every erase ends with a real read-back of the
// (loop-backed) namespace.
func TestWipeNVMePolicyPicksTheEraseTheControllerOffers(t *testing.T) {
	loop := loopDevice(t, "32M")
	root := nvmeRoot(t, loop)
	cases := []struct {
		name         string
		policy       string
		sanicap, fna int
		listNS       string
		method       string
		nvme         []string // the nvme commands, in order
		zeroFallback bool
	}{
		{"sanitize crypto erase", task.WipeNVMeSanitize, 3, 4, "list-ns-one.json", "nvme-sanitize-crypto-erase",
			[]string{"nvme id-ctrl /dev/nvme0 -o json", "nvme id-ns /dev/nvme0n1 -o json", "nvme list-ns /dev/nvme0 -o json",
				"nvme sanitize /dev/nvme0 --sanact=4", "nvme sanitize-log /dev/nvme0 -o json", "nvme sanitize-log /dev/nvme0 -o json"}, false},
		{"sanitize block erase", task.WipeNVMeSanitize, 2, 0, "list-ns-one.json", "nvme-sanitize-block-erase",
			[]string{"nvme id-ctrl /dev/nvme0 -o json", "nvme id-ns /dev/nvme0n1 -o json", "nvme list-ns /dev/nvme0 -o json",
				"nvme sanitize /dev/nvme0 --sanact=2", "nvme sanitize-log /dev/nvme0 -o json", "nvme sanitize-log /dev/nvme0 -o json"}, false},
		{"no sanitize: format crypto erase", task.WipeNVMeSanitize, 0, 4, "list-ns-one.json", "nvme-format-crypto-erase",
			[]string{"nvme id-ctrl /dev/nvme0 -o json", "nvme id-ns /dev/nvme0n1 -o json", "nvme list-ns /dev/nvme0 -o json",
				"nvme format /dev/nvme0n1 --ses=2 --force"}, false},
		{"secure erase policy never sanitizes", task.WipeSecureErase, 3, 0, "list-ns-one.json", "nvme-format-user-data-erase",
			[]string{"nvme id-ctrl /dev/nvme0 -o json", "nvme id-ns /dev/nvme0n1 -o json", "nvme list-ns /dev/nvme0 -o json",
				"nvme format /dev/nvme0n1 --ses=1 --force"}, false},
		{"shared controller: zero erase, never sanitize or whole-controller format", task.WipeNVMeSanitize, 3, 5, "list-ns-two.json", "wipefs+blkdiscard-zeroout",
			[]string{"nvme id-ctrl /dev/nvme0 -o json", "nvme id-ns /dev/nvme0n1 -o json", "nvme list-ns /dev/nvme0 -o json"}, true},
		{"blkdiscard policy on NVMe", task.WipeBlkdiscardZero, 3, 4, "list-ns-one.json", "wipefs+blkdiscard-zeroout",
			[]string{"nvme id-ctrl /dev/nvme0 -o json", "nvme id-ns /dev/nvme0n1 -o json"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dirty(t, loop)
			fw := newFakeNVMe(t, loop, c.sanicap, c.fna, c.listNS)
			var slept []time.Duration
			w := Wiper{FS: hostfs.New(root), Run: fw, Sleep: func(d time.Duration) { slept = append(slept, d) }}
			ev, err := w.WipeWith(context.Background(), WipeOptions{Device: "/dev/nvme0n1", Apply: true, Policy: c.policy,
				Identity: "serial:S64ANS0T512345K"})
			if err != nil || !ev.Verified || ev.Method != c.method || ev.Policy != c.policy {
				t.Fatalf("wipe = %+v, %v; want verified by %s", ev, err, c.method)
			}
			if got := fw.nvmeCalls(); fmt.Sprint(got) != fmt.Sprint(c.nvme) {
				t.Fatalf("nvme commands:\n got %q\nwant %q", got, c.nvme)
			}
			if fw.ran("blkdiscard -z") != c.zeroFallback || fw.ran("wipefs -a") != c.zeroFallback {
				t.Fatalf("zero erase ran = %v, want %v (calls %q)", fw.ran("blkdiscard -z"), c.zeroFallback, fw.calls)
			}
			if strings.HasPrefix(c.method, "nvme-sanitize") && len(slept) != 1 {
				t.Fatalf("sanitize progress polls waited %v, want one wait (in progress, then done)", slept)
			}
			id := ev.Identity
			if id.Serial != "S64ANS0T512345K" || id.EUI64 != "0025384511b23c41" || id.NGUID != "36344130525123450025384500000001" ||
				id.Source != "nvme id-ctrl/id-ns" || ev.Tools["nvme-cli"] != "nvme version 2.8 (git 2.8)" || !strings.Contains(ev.Tools["util-linux"], "util-linux") {
				t.Fatalf("identity %+v tools %v", id, ev.Tools)
			}
			if ev.Regions != 10 || ev.SampledBytes == 0 || ev.StartedAt.IsZero() || ev.FinishedAt.Before(ev.StartedAt) {
				t.Fatalf("read-back evidence = %+v", ev)
			}
		})
	}
}

// A sanitize the controller reports failed is not taken for an erase: the zero erase runs
// and the evidence says so.
func TestWipeNVMeFailedSanitizeFallsBackToZeroErase(t *testing.T) {
	loop := loopDevice(t, "16M")
	root := nvmeRoot(t, loop)
	dirty(t, loop)
	fw := newFakeNVMe(t, loop, 1, 0, "list-ns-one.json")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "failed.json"), []byte(`{"nvme0":{"sprog":0,"sstat":3}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fw.sanitize = []string{filepath.Join(dir, "failed.json")}
	w := Wiper{FS: hostfs.New(root), Run: fw, Sleep: func(time.Duration) {}}
	ev, err := w.WipeWith(context.Background(), WipeOptions{Device: "/dev/nvme0n1", Apply: true, Policy: task.WipeNVMeSanitize})
	if err != nil || !ev.Verified || ev.Method != "wipefs+blkdiscard-zeroout" || !fw.ran("blkdiscard -z") {
		t.Fatalf("after a failed sanitize: %+v, %v", ev, err)
	}
	if !strings.Contains(strings.Join(ev.Steps, "\n"), "sanitize failed: the controller reports the sanitize failed") {
		t.Fatalf("steps do not say the sanitize failed: %q", ev.Steps)
	}
}

// Another disk than the slot's, or an unknown policy, is refused before anything is written.
func TestWipeRefusesAnotherDiskOrUnknownPolicyBeforeWriting(t *testing.T) {
	loop := loopDevice(t, "16M")
	root := nvmeRoot(t, loop)
	dirty(t, loop)
	for name, o := range map[string]WipeOptions{
		"other serial":   {Device: "/dev/nvme0n1", Apply: true, Policy: task.WipeNVMeSanitize, Identity: "serial:S64ANS0T000000X"},
		"other eui64":    {Device: "/dev/nvme0n1", Apply: true, Policy: task.WipeBlkdiscardZero, Identity: "eui64:0025384511b23c42"},
		"unknown policy": {Device: "/dev/nvme0n1", Apply: true, Policy: "shred_35_passes"},
	} {
		fw := newFakeNVMe(t, loop, 3, 4, "list-ns-one.json")
		w := Wiper{FS: hostfs.New(root), Run: fw, Sleep: func(time.Duration) {}}
		ev, err := w.WipeWith(context.Background(), o)
		if !errors.Is(err, ErrRefused) || ev.Verified || ev.Error == "" {
			t.Fatalf("%s: %+v, %v; want refused", name, ev, err)
		}
		for _, c := range fw.calls {
			for _, destructive := range []string{"nvme sanitize ", "nvme format", "wipefs", "blkdiscard"} {
				if strings.HasPrefix(c, destructive) {
					t.Fatalf("%s: ran %q before refusing", name, c)
				}
			}
		}
	}
	out, err := hostfs.Exec{}.Run(context.Background(), "blkid", "-p", "-o", "value", "-s", "TYPE", loop)
	if err != nil || !bytes.Contains(out, []byte("ext4")) {
		t.Fatalf("the disk was touched: blkid %q %v", out, err)
	}
}

// The blkdiscard -z path on a real loop device: its evidence says honestly that a loop
// device has no hardware identity, and records util-linux's version and the read-back.
func TestWipeLoopDeviceEvidenceIsHonest(t *testing.T) {
	dev := loopDevice(t, "16M")
	dirty(t, dev)
	ev, err := wiper().WipeWith(context.Background(), WipeOptions{Device: dev, Apply: true, Policy: task.WipeNVMeSanitize})
	if err != nil || !ev.Verified || ev.Method != "wipefs+blkdiscard-zeroout" {
		t.Fatalf("wipe = %+v, %v", ev, err)
	}
	if ev.Identity.Serial != "" || ev.Identity.Source != "none: a loop device has no hardware identity" || ev.Identity.String() != ev.Identity.Source {
		t.Fatalf("identity = %+v", ev.Identity)
	}
	if !strings.Contains(ev.Tools["util-linux"], "util-linux") || ev.Regions != 10 || ev.StartedAt.IsZero() {
		t.Fatalf("evidence = %+v", ev)
	}
	// A slot that records an identity never gets a loop device wiped as its disk.
	if _, err := wiper().WipeWith(context.Background(), WipeOptions{Device: dev, Apply: true, Identity: "wwn:0x5000c500a1b2c3d4"}); !errors.Is(err, ErrRefused) {
		t.Fatalf("a disk without the recorded identity was wiped: %v", err)
	}
}
