package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/labguest"
)

// The lab: real libvirtd + QEMU (software emulation), loop devices standing in for NVMe, a
// Linux bridge for the slice network, and the project's test guest. See LAB.md.

// labCondition is the [lab] condition: true when the lab can run. Under CI a missing piece
// is an error, not a skip (.ci/run installs and starts everything).
// [libvirtd-restart] is true when the run may restart libvirtd (labguest.RestartEnv): such a
// script runs alone (make lab-libvirtd).
func labCondition(cond string) (bool, error) {
	if cond == "libvirtd-restart" {
		return os.Getenv(labguest.RestartEnv) == "1", nil
	}
	if cond != "lab" {
		return false, fmt.Errorf("unknown condition %q", cond)
	}
	missing := labguest.Missing("virsh", "wipefs", "mkfs.ext4", "ssh", "ssh-keygen", "cmp")
	if len(missing) == 0 {
		return true, nil
	}
	miss := strings.Join(missing, ", ")
	if os.Getenv("CI") != "" {
		return false, fmt.Errorf("CI must run the lab VM tests, but this machine lacks: %s (.ci/run installs them)", miss)
	}
	return false, nil
}

func sh(ts *testscript.TestScript, name string, args ...string) string {
	out, err := hostfs.Exec{}.Run(context.Background(), name, args...)
	if err != nil {
		ts.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// labBridge creates a Linux bridge with an address (removed when the script ends).
// Usage: labbridge NAME CIDR
func labBridge(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: labbridge NAME CIDR")
	}
	name, cidr := args[0], args[1]
	_, _ = hostfs.Exec{}.Run(context.Background(), "ip", "link", "del", name) // leftover of a killed run
	sh(ts, "ip", "link", "add", name, "type", "bridge")
	ts.Defer(func() { _, _ = hostfs.Exec{}.Run(context.Background(), "ip", "link", "del", name) })
	sh(ts, "ip", "addr", "add", cidr, "dev", name)
	sh(ts, "ip", "link", "set", name, "up")
}

// loopDisk makes a sparse file, attaches it to a loop device and names it
// /dev/disk/by-id/NAME, as a slot NVMe would be named (all undone when the script ends).
// Usage: loopdisk NAME SIZE VAR (VAR gets the /dev/loopN path)
func loopDisk(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: loopdisk NAME SIZE VAR")
	}
	file := ts.MkAbs(args[0] + ".img")
	sh(ts, "truncate", "-s", args[1], file)
	dev := sh(ts, "losetup", "-f", "--show", file)
	// A loop device keeps a read-only flag (blockdev --setro) across detach: start and leave
	// it writable whatever a script did.
	sh(ts, "blockdev", "--setrw", dev)
	ts.Defer(func() {
		// A script that failed half-way may leave its VM on this disk: stop it first, or the
		// loop device stays busy and leaks.
		labguest.DestroyDomainsUsing(dev)
		_, _ = hostfs.Exec{}.Run(context.Background(), "blockdev", "--setrw", dev)
		_, _ = hostfs.Exec{}.Run(context.Background(), "losetup", "-d", dev)
	})
	link := "/dev/disk/by-id/" + args[0]
	ts.Check(os.MkdirAll(filepath.Dir(link), 0o755))
	_ = os.Remove(link)
	ts.Check(os.Symlink(dev, link))
	ts.Defer(func() { _ = os.Remove(link) })
	ts.Setenv(args[2], dev)
}

// labImage serves an image from a local HTTP server and writes a catalog entry for it pinned
// to its sha256. SOURCE "guest" is the project's test guest (built or taken from the cache);
// anything else is a file in $WORK. "bad-digest" pins a wrong digest. The entry says
// active: true (the controller must then allow untested images) unless "pending" is given:
// such an image goes through images test and images activate.
// Usage: labimage SLUG YAML SOURCE [bad-digest|pending]
func labImage(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 3 {
		ts.Fatalf("usage: labimage SLUG YAML guest|FILE [bad-digest|pending]")
	}
	path, digest, desc := "", "", ""
	if args[2] == "guest" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		img, err := labguest.Ensure(ctx, hostfs.Exec{})
		ts.Check(err)
		path, digest, desc = img.Path, img.SHA256, "gpuaas lab test guest ("+img.Kernel+")"
	} else {
		path = ts.MkAbs(args[2])
		b, err := os.ReadFile(path)
		ts.Check(err)
		sum := sha256.Sum256(b)
		digest, desc = hex.EncodeToString(sum[:]), "lab image "+args[2]
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	ts.Check(err)
	srv := &http.Server{Handler: http.FileServer(http.Dir(filepath.Dir(path))), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ts.Logf("image server: %v", err)
		}
	}()
	ts.Defer(func() { _ = srv.Close() })
	// The URL's host is how the image's consumer reaches this machine's loopback: itself, or
	// 10.0.2.2 from inside the lab host VM ($LABIMAGE_HOST).
	urlHost := l.Addr().String()
	if h := ts.Getenv("LABIMAGE_HOST"); h != "" {
		urlHost = h + ":" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	}
	active := "true"
	switch {
	case len(args) == 4 && args[3] == "bad-digest":
		digest = strings.Repeat("0", 64)
	case len(args) == 4 && args[3] == "pending":
		active = "false"
	case len(args) > 3:
		ts.Fatalf("labimage: unknown option %q", args[3])
	}
	yaml := fmt.Sprintf(`slug: %s
display_name: %s
version: "1"
target: vm_slice
family: debian
architecture: amd64
image_format: qcow2
source_type: http
source_ref: http://%s/%s
digest_sha256: "%s"
default_username: debian
driver_strategy: none
active: %s
`, args[0], desc, urlHost, filepath.Base(path), digest, active)
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), []byte(yaml), 0o644))
}

// waitSlots waits until N of a node's slots have a status. Usage: waitslots NODE STATUS N [timeout]
func waitSlots(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 3 {
		ts.Fatalf("usage: waitslots NODE STATUS N [timeout]")
	}
	want, err := strconv.Atoi(args[2])
	ts.Check(err)
	timeout := 120 * time.Second
	if len(args) == 4 {
		timeout, err = time.ParseDuration(args[3])
		ts.Check(err)
	}
	c := scriptClient(ts)
	deadline := time.Now().Add(timeout)
	got := map[string]int{}
	for time.Now().Before(deadline) {
		slots, err := c.ListSlots(context.Background(), args[0])
		if err == nil {
			got = map[string]int{}
			for _, s := range slots {
				got[s.Status]++
			}
			if got[args[1]] == want {
				return
			}
		}
		time.Sleep(200 * time.Millisecond) // status poll; the deadline bounds it
	}
	ts.Fatalf("node %s: slots by status %v after %s, want %d %s", args[0], got, timeout, want, args[1])
}

// waitStaged waits until N of a node's slots have an image staged on their disks (warm
// slots). Usage: waitstaged NODE N [timeout]
func waitStaged(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: waitstaged NODE N [timeout]")
	}
	want, err := strconv.Atoi(args[1])
	ts.Check(err)
	timeout := 120 * time.Second
	if len(args) == 3 {
		timeout, err = time.ParseDuration(args[2])
		ts.Check(err)
	}
	c := scriptClient(ts)
	deadline := time.Now().Add(timeout)
	got := 0
	for time.Now().Before(deadline) {
		slots, err := c.ListSlots(context.Background(), args[0])
		if err == nil {
			got = 0
			for _, s := range slots {
				if s.StagedImage != nil {
					got++
				}
			}
			if got == want {
				return
			}
		}
		time.Sleep(200 * time.Millisecond) // slot poll; the deadline bounds it
	}
	ts.Fatalf("node %s: %d slots staged after %s, want %d", args[0], got, timeout, want)
}

// labMount formats a device and mounts it (unmounted when the script ends).
// Usage: labmount DEVICE DIR
func labMount(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: labmount DEVICE DIR")
	}
	dir := ts.MkAbs(args[1])
	ts.Check(os.MkdirAll(dir, 0o755))
	sh(ts, "mkfs.ext4", "-q", "-F", args[0])
	sh(ts, "mount", args[0], dir)
	ts.Defer(func() { _, _ = hostfs.Exec{}.Run(context.Background(), "umount", dir) })
}
