package labhost

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

//go:embed init.sh
var initScript []byte

// Machine is one booted lab host.
type Machine struct {
	Dir     string // the run's files: overlay, disks, console.log, share/
	Share   string // mounted at /gpuaas in the host; out/ holds its logs
	SSHPort int
	Layout  Layout
	key     string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// BootOptions says where the run lives and what it shares in.
type BootOptions struct {
	Dir      string            // empty: a new temporary directory
	Binaries map[string]string // name in /gpuaas/bin -> file on this machine
	Log      io.Writer         // progress lines (may be nil)
}

// Boot starts a lab host from img with layout l and returns once its sshd answers and its
// init script has brought up libvirtd (or fails with the console's last lines).
func Boot(ctx context.Context, img Image, l Layout, o BootOptions) (*Machine, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	dir := o.Dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "gpuaas-labhost-"); err != nil {
			return nil, err
		}
	}
	m := &Machine{Dir: dir, Share: filepath.Join(dir, "share"), Layout: l, key: filepath.Join(dir, "id_ed25519"), exited: make(chan struct{})}
	for _, d := range []string{filepath.Join(m.Share, "bin"), filepath.Join(m.Share, "out")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(m.Share, "init.sh"), initScript, 0o755); err != nil {
		return nil, err
	}
	for name, src := range o.Binaries {
		if err := copyFile(src, filepath.Join(m.Share, "bin", name), 0o755); err != nil {
			return nil, err
		}
	}
	if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", m.key).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("labhost: ssh-keygen: %v: %s", err, out)
	}
	if err := copyFile(m.key+".pub", filepath.Join(m.Share, "authorized_keys"), 0o644); err != nil {
		return nil, err
	}
	overlay := filepath.Join(dir, "root.qcow2")
	if out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", img.RootFS, overlay).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("labhost: overlay: %v: %s", err, out)
	}
	for n := 0; n < l.NUMANodes; n++ {
		for i := 0; i < l.DisksPerNode; i++ {
			if err := os.Truncate(createFile(DiskFile(dir, n, i)), int64(l.DiskMiB)<<20); err != nil {
				return nil, err
			}
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	m.SSHPort = port
	m.cmd = exec.Command("qemu-system-x86_64", l.Args(img, overlay, dir, m.Share, port, kvmUsable())...)
	qlog, err := os.Create(filepath.Join(dir, "qemu.log"))
	if err != nil {
		return nil, err
	}
	m.cmd.Stdout, m.cmd.Stderr = qlog, qlog
	if err := m.cmd.Start(); err != nil {
		qlog.Close()
		return nil, fmt.Errorf("labhost: qemu: %w", err)
	}
	go func() {
		m.waitErr = m.cmd.Wait()
		qlog.Close()
		close(m.exited)
	}()
	if o.Log != nil {
		fmt.Fprintf(o.Log, "lab host: qemu pid %d, ssh on 127.0.0.1:%d, files in %s\n", m.cmd.Process.Pid, port, dir)
	}
	deadline := time.Now().Add(20 * time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(m.Share, "out", "ready")); err == nil {
			if _, err := m.Exec(ctx, "true"); err == nil {
				return m, nil
			}
		}
		select {
		case <-m.exited:
			return nil, fmt.Errorf("labhost: QEMU exited (%v) before the host was up: %s; console: %s", m.waitErr, tail(filepath.Join(dir, "qemu.log"), 800), tail(filepath.Join(dir, "console.log"), 1500))
		case <-ctx.Done():
			m.Kill()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		if time.Now().After(deadline) {
			m.Kill()
			return nil, fmt.Errorf("labhost: the host was not up within 20 minutes; console: %s", tail(filepath.Join(dir, "console.log"), 2000))
		}
	}
}

// Exec runs a shell command line in the host as root over SSH and returns its output
// (stdout and stderr together).
func (m *Machine) Exec(ctx context.Context, script string) ([]byte, error) {
	args := []string{"-i", m.key, "-p", strconv.Itoa(m.SSHPort), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", "root@127.0.0.1", "export PATH=/gpuaas/bin:$PATH; " + script}
	var out bytes.Buffer
	c := exec.CommandContext(ctx, "ssh", args...)
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	return out.Bytes(), err
}

// Kill stops QEMU at once.
func (m *Machine) Kill() {
	if m.cmd != nil && m.cmd.Process != nil {
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
}

// Stop powers the host off and waits for QEMU to exit (killing it after 30 s).
func (m *Machine) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = m.Exec(ctx, "sync; (sleep 1; poweroff -f) >/dev/null 2>&1 &")
	select {
	case <-m.exited:
	case <-time.After(30 * time.Second):
		m.Kill()
	}
}

// Running says whether QEMU still runs.
func (m *Machine) Running() bool {
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

// kvmUsable says whether to run the host VM on KVM: only when GPUAAS_LABHOST_KVM=1 and
// /dev/kvm opens. Opt-in, because a /dev/kvm that opens is not one that works: on a machine
// that is itself a VM without working nested virtualisation, KVM guests hang or abort (the
// lab machines here do), while software emulation always runs.
func kvmUsable() bool {
	if os.Getenv("GPUAAS_LABHOST_KVM") != "1" {
		return false
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func createFile(p string) string {
	if f, err := os.Create(p); err == nil {
		f.Close()
	}
	return p
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

func tail(p string, n int) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

//go:embed snapshot.sh
var snapshotScript []byte

// Snapshot packs what discovery reads from the host's kernel (sysfs, /dev/disk/by-id,
// /proc/mounts) into dst (.tar.gz), in the tree layout discovery tests read.
func (m *Machine) Snapshot(ctx context.Context, dst string) error {
	if err := os.WriteFile(filepath.Join(m.Share, "snapshot.sh"), snapshotScript, 0o755); err != nil {
		return err
	}
	if out, err := m.Exec(ctx, "bash /gpuaas/snapshot.sh /gpuaas/out/snapshot.tar.gz"); err != nil {
		return fmt.Errorf("labhost: snapshot: %v: %s", err, out)
	}
	return copyFile(filepath.Join(m.Share, "out", "snapshot.tar.gz"), dst, 0o644)
}
