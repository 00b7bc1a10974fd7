package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/labhost"
)

// LabHostEnv set to 1 runs the lab host scripts (make lab-host): a Debian host VM on emulated
// PCIe hardware running hostd's production libvirt runtime. Tens of minutes on 2 cores.
const LabHostEnv = "GPUAAS_LAB_HOST"

// TestLabHost runs testdata/labhost: the production host path (libvirt runtime, IOMMU,
// vfio-pci, NVMe admin commands) on the lab host VM, driven through the real controller.
func TestLabHost(t *testing.T) {
	if os.Getenv(LabHostEnv) != "1" {
		t.Skipf("%s=1 boots the lab host VM (make lab-host)", LabHostEnv)
	}
	if miss := labhostMissing(); len(miss) > 0 {
		t.Fatalf("the lab host needs: %s", strings.Join(miss, ", "))
	}
	testscript.Run(t, scriptParams(t, filepath.Join("..", "..", "testdata", "labhost"), func(env *testscript.Env) {
		// The host VM reaches this machine's loopback as 10.0.2.2 (QEMU user networking).
		addr := env.Getenv("ADDR")
		env.Setenv("LABHOST_SERVER", "https://10.0.2.2:"+addr[strings.LastIndex(addr, ":")+1:])
		env.Setenv("LABIMAGE_HOST", "10.0.2.2")
	}))
}

func labhostMissing() []string {
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "root")
	}
	for _, t := range []string{"qemu-system-x86_64", "qemu-img", "debootstrap", "mkfs.ext4", "ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(t); err != nil {
			miss = append(miss, t)
		}
	}
	return miss
}

// labhosts holds each script's booted machine (scripts run one at a time: one VM fills the
// machine).
var labhosts = map[*testscript.TestScript]*labhost.Machine{}

// labHost drives the lab host VM. Usage:
//
//	labhost boot                  build (cached) and boot the host; static gpuaas-hostd in /gpuaas/bin
//	labhost put FILE NAME         copy FILE into the share: /gpuaas/NAME in the host
//	labhost exec CMD ARGS...      run a command in the host (as root); stdout is its output
//	labhost start NAME CMD...     start a background command; its output goes to /gpuaas/out/NAME.log
//	labhost stop NAME             stop a background command (SIGTERM, then wait)
//	labhost log NAME              print /gpuaas/out/NAME.log
//	labhost snapshot              pack what discovery reads from the host's kernel into $GPUAAS_LABHOST_SNAPSHOT
func labHost(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) == 0 {
		ts.Fatalf("usage: labhost boot|put|exec|start|stop|log ...")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if args[0] == "boot" {
		bootLabHost(ctx, ts)
		return
	}
	m := labhosts[ts]
	if m == nil {
		ts.Fatalf("labhost %s: no host booted", args[0])
	}
	switch args[0] {
	case "put":
		if len(args) != 3 || strings.Contains(args[2], "/") {
			ts.Fatalf("usage: labhost put FILE NAME")
		}
		b, err := os.ReadFile(ts.MkAbs(args[1]))
		ts.Check(err)
		ts.Check(os.WriteFile(filepath.Join(m.Share, args[2]), b, 0o644))
	case "exec":
		out, err := m.Exec(ctx, shellJoin(args[1:]))
		fmt.Fprint(ts.Stdout(), string(out))
		if err != nil && !neg {
			ts.Fatalf("labhost exec %s: %v", strings.Join(args[1:], " "), err)
		}
		if err == nil && neg {
			ts.Fatalf("labhost exec %s: succeeded unexpectedly", strings.Join(args[1:], " "))
		}
	case "start":
		if len(args) < 3 {
			ts.Fatalf("usage: labhost start NAME CMD...")
		}
		name := args[1]
		script := fmt.Sprintf("setsid sh -c 'echo $$ > /gpuaas/out/%s.pid; exec %s' >/gpuaas/out/%s.log 2>&1 </dev/null &", name,
			strings.ReplaceAll(shellJoin(args[2:]), "'", `'\''`), name)
		if out, err := m.Exec(ctx, script); err != nil {
			ts.Fatalf("labhost start %s: %v: %s", name, err, out)
		}
	case "stop":
		if len(args) != 2 {
			ts.Fatalf("usage: labhost stop NAME")
		}
		script := fmt.Sprintf("p=$(cat /gpuaas/out/%[1]s.pid) && kill $p && for i in $(seq 1 60); do kill -0 $p 2>/dev/null || exit 0; sleep 1; done; kill -9 $p", args[1])
		if out, err := m.Exec(ctx, script); err != nil {
			ts.Fatalf("labhost stop %s: %v: %s", args[1], err, out)
		}
	case "snapshot":
		// The kernel's view for discovery tests, saved only when GPUAAS_LABHOST_SNAPSHOT names a
		// file (how internal/topology/testdata/labhost-sysfs.tar.gz is refreshed): packing it
		// takes minutes under emulation.
		dst := os.Getenv("GPUAAS_LABHOST_SNAPSHOT")
		if dst == "" {
			ts.Logf("labhost snapshot: skipped (GPUAAS_LABHOST_SNAPSHOT names no file)")
			return
		}
		ts.Check(m.Snapshot(ctx, dst))
	case "log":
		b, err := os.ReadFile(filepath.Join(m.Share, "out", args[1]+".log"))
		ts.Check(err)
		fmt.Fprint(ts.Stdout(), string(b))
	default:
		ts.Fatalf("labhost: unknown subcommand %q", args[0])
	}
}

func bootLabHost(ctx context.Context, ts *testscript.TestScript) {
	t0 := time.Now()
	img, built, err := labhost.Ensure(ctx, hostfs.Exec{})
	ts.Check(err)
	ts.Logf("lab host: image %s (%s, %s)", img.RootFS, map[bool]string{true: "built now", false: "cached"}[built], time.Since(t0).Round(time.Second))
	hostd := os.Getenv("GPUAAS_LABHOST_HOSTD")
	if hostd == "" {
		hostd = filepath.Join(ts.Getenv("WORK"), "gpuaas-hostd")
		b := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", hostd, "github.com/gpuaas/gpuaas/cmd/gpuaas-hostd")
		b.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := b.CombinedOutput(); err != nil {
			ts.Fatalf("building a static gpuaas-hostd: %v: %s", err, out)
		}
	}
	t1 := time.Now()
	m, err := labhost.Boot(ctx, img, labhost.DefaultLayout(), labhost.BootOptions{Dir: filepath.Join(ts.Getenv("WORK"), "labhost"),
		Binaries: map[string]string{"gpuaas-hostd": hostd}})
	ts.Check(err)
	labhosts[ts] = m
	ts.Defer(func() {
		m.Stop()
		delete(labhosts, ts)
	})
	ts.Logf("lab host: up in %s (QEMU, software emulation), ssh 127.0.0.1:%d", time.Since(t1).Round(time.Second), m.SSHPort)
}

// shellJoin quotes args for sh -c.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@+%", r))
		}) < 0 {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
