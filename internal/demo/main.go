// Command demo is `make demo`: it runs the main job end to end on the embedded default — a
// private PostgreSQL under a temporary state directory, the controller, a node with approved
// slots, a host daemon enrolled with the node's one-time bootstrap token, the first image
// smoke-tested on that node, activated and made the SKU's default, and an allocation
// created, provisioned through real signed tasks, shown with its phase timings, and released
// with wipe proofs — printing every command and its output. Where libvirt can run (root, a
// running libvirtd, QEMU, OVMF) it takes the lab path: a real VM boots, gpuaasctl ssh logs
// into it, and release wipes its loop-device disks; elsewhere the sim runtime, saying which.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/labguest"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		os.Exit(1)
	}
}

type demo struct {
	bin  string
	dir  string
	env  []string
	step int
}

func run() error {
	bin := flag.String("bin", "bin", "directory holding the built binaries")
	keep := flag.Bool("keep", false, "keep the state directory afterwards")
	forceSim := flag.Bool("sim", false, "use the sim runtime even where a real VM could boot")
	flag.Parse()
	useLab := false
	if missing := strings.Join(labguest.Missing(), ", "); *forceSim || missing != "" {
		why := "--sim given"
		if !*forceSim {
			why = "this machine lacks " + missing + " (as root: apt-get install libvirt-daemon-system qemu-system-x86 qemu-utils ovmf dosfstools mtools; virtlogd -d; libvirtd -d)"
		}
		fmt.Printf("Path: SIM runtime (no VM; every output says simulated): %s.\n", why)
	} else {
		useLab = true
		fmt.Println("Path: LAB runtime: libvirt can run here, so a real VM boots (QEMU emulation), gpuaasctl ssh logs into it, and release wipes its disks.")
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gpuaas-demo-")
	if err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil { // the embedded PostgreSQL user must traverse it
		return err
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	d := &demo{bin: abs, dir: dir}
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)

	d.say("Start the controller on the embedded default (private PostgreSQL under the state directory)")
	logf, err := os.Create(filepath.Join(dir, "controller.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"serve", "--state-dir", filepath.Join(dir, "state"), "--listen", addr}
	if !useLab {
		// The sim path sells a simulated host, which a controller does only when told to; it
		// then labels the node, the allocation and every phase simulated.
		args = append(args, "--allow-simulated-hosts")
	}
	ctl := exec.Command(filepath.Join(abs, "gpuaas-controller"), args...)
	ctl.Stdout, ctl.Stderr = logf, logf
	fmt.Printf("$ gpuaas-controller %s\n", strings.Join(args, " "))
	if err := ctl.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- ctl.Wait() }()
	defer func() {
		_ = ctl.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = ctl.Process.Kill()
		}
		fmt.Println("\ncontroller stopped (embedded PostgreSQL stopped with it)")
	}()
	state := filepath.Join(dir, "state")
	if err := waitReady("https://"+addr, filepath.Join(state, "tls", "ca.crt"), 90*time.Second, exited); err != nil {
		tail, _ := os.ReadFile(logf.Name())
		return fmt.Errorf("%w\ncontroller log:\n%s", err, tail)
	}
	fmt.Printf("ready: https://%s  (CA %s/tls/ca.crt, admin token in %s/admin.token, mode 0600)\n", addr, state, state)
	d.env = append(os.Environ(), "GPUAAS_SERVER=https://"+addr, "GPUAAS_CA_FILE="+filepath.Join(state, "tls", "ca.crt"),
		"GPUAAS_TOKEN_FILE="+filepath.Join(state, "admin.token"), "NO_COLOR=1")

	d.say("The catalog: seeded SKUs (seed 002)")
	if _, err := d.ctl("skus", "list"); err != nil {
		return err
	}

	d.say("Create a tenant and a tenant-scoped token")
	out, err := d.ctl("tenants", "create", "acme", "-o", "json")
	if err != nil {
		return err
	}
	var tenant apiv1.Tenant
	if err := json.Unmarshal(out, &tenant); err != nil {
		return fmt.Errorf("tenant json: %w", err)
	}
	out, err = d.ctl("tokens", "create", "--name", "acme-demo", "--role", "tenant", "--tenant", tenant.ID, "-o", "json")
	if err != nil {
		return err
	}
	var tok apiv1.Token
	if err := json.Unmarshal(out, &tok); err != nil {
		return fmt.Errorf("token json: %w", err)
	}
	tenantTok := filepath.Join(dir, "acme.token")
	if err := os.WriteFile(tenantTok, []byte(tok.Token+"\n"), 0o600); err != nil {
		return err
	}

	d.say("Register a slice image, pinned by the sha256 of its artifact: a new image starts pending (smoke-tested below)")
	artifact := filepath.Join(dir, "demo-image.qcow2")
	if err := os.WriteFile(artifact, bytes.Repeat([]byte("gpuaas demo image\n"), 4096), 0o644); err != nil {
		return err
	}
	sum, err := fileSHA256(artifact)
	if err != nil {
		return err
	}
	source := "file://" + artifact
	var lb *lab
	if useLab {
		if lb, err = setupLab(dir); err != nil {
			return err
		}
		defer lb.close()
		source, sum = lb.imageURL, lb.imageSHA256
	}
	img := apiv1.OSImage{Slug: "demo-debian-12-slice", DisplayName: "Debian 12 demo slice image", Version: "12",
		Target: "vm_slice", Family: "debian", Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http",
		SourceRef: source, DigestSHA256: sum, DefaultUsername: "debian", DriverStrategy: "none",
		CompatibilityMetadata: json.RawMessage(`{}`)}
	if err := writeYAML(filepath.Join(dir, "image.yaml"), img); err != nil {
		return err
	}
	if _, err := d.ctl("images", "add", "-f", filepath.Join(dir, "image.yaml")); err != nil {
		return err
	}

	d.say("Register an 8x H200 node: the answer carries its one-time bootstrap token (--jq picks the fields the demo needs)")
	out, err = d.ctl("nodes", "add", "h200-demo-01", "--region", "lab", "--sku", "h200-sxm-baremetal-8g",
		"--slice-sku", "h200-sxm-slice", "--profile-tag", "gpuaas-profile-slice-vm", "--hardware-tag", "gpu-nvidia-h200",
		"--jq", "{name, bootstrap_token, bootstrap_token_expires_at}")
	if err != nil {
		return err
	}
	var node apiv1.Node
	if err := json.Unmarshal(out, &node); err != nil || node.BootstrapToken == "" {
		return fmt.Errorf("node json without bootstrap_token: %v", err)
	}

	hostdCfg := filepath.Join(dir, "hostd", "hostd.yaml")
	hostRoot := filepath.Join(dir, "hostroot")
	caFile := filepath.Join(state, "tls", "ca.crt")
	runtime, runArgs := "sim", []string{"run", "--config", hostdCfg, "--heartbeat", "2s", "--sim-phase-delay", "100ms"}
	if useLab {
		d.say("Apply the lab node's slot map (two slots whose NVMe are the loop devices)")
		if err := os.WriteFile(filepath.Join(dir, "slots.yaml"), []byte(lb.slotsYAML()), 0o644); err != nil {
			return err
		}
		if _, err := d.ctl("slots", "apply", "h200-demo-01", "-f", filepath.Join(dir, "slots.yaml")); err != nil {
			return err
		}
		runtime, hostRoot = "lab", "/"
		runArgs = []string{"run", "--config", hostdCfg, "--heartbeat", "2s", "--data-dir", filepath.Join(dir, "data"), "--bridge", lb.bridge,
			"--bridge-address", lb.cidr, "--telemetry-addr", ":0", "--readiness-timeout", "180s"}
	}
	d.say("Enroll the host daemon with the node's one-time bootstrap token, then run it (" + runtime + " runtime)")
	if err := d.run("gpuaas-hostd", "enroll", "--server", "https://"+addr, "--ca-file", caFile, "--token", node.BootstrapToken,
		"--config", hostdCfg, "--runtime", runtime, "--host-root", hostRoot, "--state-dir", filepath.Join(dir, "hostd", "state")); err != nil {
		return err
	}
	hlog, err := os.Create(filepath.Join(dir, "hostd.log"))
	if err != nil {
		return err
	}
	defer hlog.Close()
	if !useLab {
		// A fixture host root (FAKE boundary: no real GPU/NVMe/IB here): a generated sysfs tree
		// of an 8x H200 host (seed 004's PCI map), read by hostd through its host seam.
		if err := fixture.Write(hostRoot, fixture.H200()); err != nil {
			return err
		}
		evidence := filepath.Join(hostRoot, "var/lib/gpuaas/firmware-profile/evidence.json")
		if err := os.MkdirAll(filepath.Dir(evidence), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(evidence, []byte(`{"profile_tag":"gpuaas-profile-slice-vm","version":"fixture-1","status":"verified"}`), 0o644); err != nil {
			return err
		}
		fmt.Printf("(host root %s: a generated 8x H200 sysfs tree — the fake boundary for hardware this machine lacks)\n", hostRoot)
	}
	hostd := exec.Command(filepath.Join(abs, "gpuaas-hostd"), runArgs...)
	hostd.Stdout, hostd.Stderr = hlog, hlog
	fmt.Printf("$ gpuaas-hostd run --config %s &\n", hostdCfg)
	if err := hostd.Start(); err != nil {
		return err
	}
	hostdExited := make(chan error, 1)
	go func() { hostdExited <- hostd.Wait() }()
	defer func() {
		_ = hostd.Process.Signal(syscall.SIGTERM)
		select {
		case <-hostdExited:
		case <-time.After(20 * time.Second):
			_ = hostd.Process.Kill()
		}
		fmt.Println("host daemon stopped")
	}()
	api, err := client.New(client.Options{Server: "https://" + addr, CAFile: caFile, Token: readToken(filepath.Join(state, "admin.token"))})
	if err != nil {
		return err
	}
	if err := waitFor(60*time.Second, func() (bool, error) {
		n, err := api.GetNode(context.Background(), "h200-demo-01")
		return err == nil && n.LastHeartbeatAt != nil, nil
	}); err != nil {
		return fmt.Errorf("host daemon never reported a heartbeat: %w", err)
	}

	if !useLab {
		d.say("Discover the host's topology through a signed task: GPUs, NVMe, fabric, and the candidate slots")
		if _, err := d.ctl("topology", "discover", "h200-demo-01", "--wait"); err != nil {
			return err
		}
		d.say("Approve the ready candidates: each slot gets its devices, its own host CPUs, a MAC and an IP")
		if _, err := d.ctl("slots", "approve", "h200-demo-01", "--all-ready", "--yes"); err != nil {
			return err
		}
	}
	if _, err := d.ctl("nodes", "show", "h200-demo-01"); err != nil {
		return err
	}

	// The first image goes through the same gate as every later one (docs/images.md).
	d.say("Smoke-test the image on the node through the normal provisioning path, then activate it and make it the SKU's default")
	if _, err := d.ctl("images", "test", img.Slug, "--node", "h200-demo-01", "--wait"); err != nil {
		return err
	}
	if _, err := d.ctl("images", "activate", img.Slug); err != nil {
		return err
	}
	if _, err := d.ctl("images", "default", "h200-sxm-slice", img.Slug); err != nil {
		return err
	}

	tenantEnv := func() { d.env = append(d.env, "GPUAAS_TOKEN_FILE="+tenantTok) }
	adminEnv := func() { d.env = append(d.env, "GPUAAS_TOKEN_FILE="+filepath.Join(state, "admin.token")) }
	tenantEnv()
	// The lab host has two slots; the generated H200 host eight.
	dryRun := "4"
	if useLab {
		dryRun = "2"
	}
	d.say("As the tenant: capacity, and a placement dry run for " + dryRun + " GPUs")
	if _, err := d.ctl("capacity", "--sku", "h200-sxm-slice"); err != nil {
		return err
	}
	if _, err := d.ctl("alloc", "explain", "--sku", "h200-sxm-slice", "--gpus", dryRun); err != nil {
		return err
	}

	d.say("Create a 2-GPU slice allocation: the host's phases stream as they complete; --jq .id prints just its id")
	out, err = d.ctl("alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "--wait", "--jq", ".id")
	if err != nil {
		return err
	}
	a := apiv1.Allocation{ID: strings.TrimSpace(string(out))}
	if _, err := d.ctl("alloc", "show", a.ID); err != nil {
		return err
	}
	adminEnv()
	d.say("The operator's view: node, slots, NUMA, devices, and the task's 17 timed phases")
	if _, err := d.ctl("alloc", "show", a.ID); err != nil {
		return err
	}
	tenantEnv()
	if useLab {
		d.say("As the tenant, into the VM through the controller's audited relay (hostd dials out, SSHes in with the relay key)")
		if _, err := d.ctl("ssh", a.ID, "--", "uname", "-a"); err != nil {
			return err
		}
		if _, err := d.ctl("ssh", a.ID, "--", "sh", "-c", "echo ready since $(cat /var/lib/gpuaas/slice-ready); ip -4 addr show eth0 | grep inet"); err != nil {
			return err
		}
	}

	d.say("A 3-GPU request is refused with a machine-readable reason (exit code 6)")
	if _, err := d.ctl("alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "3"); err == nil {
		return errors.New("3-GPU request unexpectedly succeeded")
	}

	d.say("Release the allocation: slice.vm_release tears down and returns wipe proofs")
	if _, err := d.ctl("alloc", "release", a.ID, "--wait", "--yes"); err != nil {
		return err
	}
	if err := waitFor(120*time.Second, func() (bool, error) {
		got, err := api.GetAllocation(context.Background(), a.ID)
		return err == nil && got.Status == "released", nil
	}); err != nil {
		return err
	}
	if _, err := d.ctl("alloc", "show", a.ID, "--jq", "{status, handover}"); err != nil {
		return err
	}
	adminEnv()
	if _, err := d.ctl("slots", "list", "h200-demo-01"); err != nil {
		return err
	}
	d.say("Every privileged action is in the audit log")
	if _, err := d.ctl("audit", "--limit", "12"); err != nil {
		return err
	}
	if useLab {
		d.say("Every terminal session is recorded with who, bytes and exit status")
		if _, err := d.ctl("sessions", "list"); err != nil {
			return err
		}
	}
	fmt.Println("\ndemo complete: controller + embedded PostgreSQL, an enrolled host daemon, a node with approved slots,")
	fmt.Println("an allocation provisioned and released through signed tasks.")
	if useLab {
		fmt.Println("real here: the VM (libvirt + QEMU emulation, UEFI boot from a loop-device \"NVMe\", DHCP from hostd), the SSH session, the verified wipe.")
		fmt.Println("not here: GPU/VF passthrough (no such hardware): those phases said \"skipped: lab host\".")
	} else {
		fmt.Println("simulated here: the VM itself (sim runtime). With root and libvirt running, `make demo` boots a real VM instead.")
	}
	return nil
}

// shellJoin quotes args as a shell would need them, so an echoed command can be pasted.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,@%+") == "" {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

func (d *demo) say(s string) {
	d.step++
	fmt.Printf("\n== %d. %s\n", d.step, s)
}

// ctl runs gpuaasctl, echoing the command and its output.
func (d *demo) ctl(args ...string) ([]byte, error) {
	fmt.Printf("$ gpuaasctl %s\n", shellJoin(args))
	cmd := exec.Command(filepath.Join(d.bin, "gpuaasctl"), args...)
	cmd.Env = d.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	os.Stdout.Write(stdout.Bytes())
	os.Stdout.Write(stderr.Bytes())
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			fmt.Printf("(exit code %d)\n", ee.ExitCode())
		}
		return stdout.Bytes(), fmt.Errorf("gpuaasctl %s: %w", strings.Join(args, " "), err)
	}
	return stdout.Bytes(), nil
}

func waitReady(url, caFile string, timeout time.Duration, exited chan error) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err // let the deferred stop see it too
			return fmt.Errorf("controller exited during start: %v", err)
		default:
		}
		pem, err := os.ReadFile(caFile)
		if err == nil {
			pool := x509.NewCertPool()
			if pool.AppendCertsFromPEM(pem) {
				c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				req, _ := http.NewRequestWithContext(ctx, "GET", url+"/readyz", nil)
				resp, err := c.Do(req)
				cancel()
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == 200 {
						return nil
					}
				}
			}
		}
		time.Sleep(200 * time.Millisecond) // readiness poll interval, bounded by the deadline
	}
	return fmt.Errorf("controller not ready after %s", timeout)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func fileSHA256(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}

func writeYAML(path string, v any) error {
	// Round-trip through JSON so the YAML keys are the API's JSON field names.
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var generic any
	if err := json.Unmarshal(j, &generic); err != nil {
		return err
	}
	y, err := yaml.Marshal(generic)
	if err != nil {
		return err
	}
	return os.WriteFile(path, y, 0o644)
}

// run runs one of the built binaries, echoing it.
func (d *demo) run(bin string, args ...string) error {
	fmt.Printf("$ %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(filepath.Join(d.bin, bin), args...)
	out, err := cmd.CombinedOutput()
	os.Stdout.Write(out)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	return nil
}

func readToken(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// waitFor polls cond until it is true, fails, or timeout passes.
func waitFor(timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		time.Sleep(200 * time.Millisecond) // status poll, bounded by the deadline
	}
	return fmt.Errorf("timed out after %s", timeout)
}
