package slicevm

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/cpuset"
	"github.com/gpuaas/gpuaas/internal/dhcpd"
	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/hypervisor"
	"github.com/gpuaas/gpuaas/internal/imagecache"
	"github.com/gpuaas/gpuaas/internal/labguest"
	"github.com/gpuaas/gpuaas/internal/leases"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/telemetry"
)

// The lab runtime driven straight from Go with provision plans built here: real libvirtd and
// QEMU (software emulation), the project's test guest, loop devices standing in for the slot
// NVMe (docs/slice-runtime.md "Lab"). Needs root and a running libvirtd; CI has both.

// labRig is a lab Host on its own bridge, DHCP server and data dir.
type labRig struct {
	h      *Host
	subnet string // "10.x.y." prefix of the bridge network
	img    labguest.Image
	n      int // disks made so far
}

func newLabRig(t *testing.T) *labRig {
	t.Helper()
	missing := labguest.Missing("virsh", "qemu-img", "losetup", "ip", "truncate")
	if _, err := os.Stat(hypervisor.DefaultSocket); err != nil {
		missing = append(missing, "libvirtd ("+hypervisor.DefaultSocket+")")
	}
	for _, f := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if len(missing) > 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must run the lab VM tests, but this machine lacks: %s (.ci/run sets them up)", strings.Join(missing, ", "))
		}
		t.Skipf("lab VM test needs %s (see LAB.md)", strings.Join(missing, ", "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img, err := labguest.Ensure(ctx, hostfs.Exec{})
	if err != nil {
		t.Fatal(err)
	}
	// QEMU runs as an unprivileged user: it must traverse to the seed ISO and NVRAM.
	data, err := os.MkdirTemp("", "gpuaas-labnuma-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	if err := os.Chmod(data, 0o711); err != nil {
		t.Fatal(err)
	}
	// A bridge and subnet of its own: other lab tests may run beside this one.
	pid := os.Getpid()
	bridge := fmt.Sprintf("gpnuma%d", pid%100000)
	subnet := fmt.Sprintf("10.%d.%d.", 200+pid%50, (pid/50)%250)
	_ = exec.Command("ip", "link", "del", bridge).Run() // the leftover of a killed run
	run(t, "ip", "link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", bridge).Run() })
	run(t, "ip", "addr", "add", subnet+"1/24", "dev", bridge)
	run(t, "ip", "link", "set", bridge, "up")
	srv, err := dhcpd.New(dhcpd.Config{Interface: bridge, ServerIP: net.ParseIP(subnet + "1"), Netmask: net.CIDRMask(24, 32),
		StateFile: filepath.Join(data, "dhcp", "reservations.json"), Logger: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close() })
	hv, err := hypervisor.Connect(hypervisor.DefaultSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hv.Close() })
	h, err := NewHost(HostConfig{Lab: true, DataDir: data, FS: hostfs.New("/"), Run: hostfs.Exec{}, Hypervisor: hv,
		Leases: &leases.Dir{Path: filepath.Join(data, "leases"), TTL: time.Hour}, Images: &imagecache.Cache{Dir: filepath.Join(data, "images")},
		DHCP: srv, Telemetry: telemetry.NewRegistry(), Bridge: bridge, ReadinessTimeout: 4 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &labRig{h: h, subnet: subnet, img: img}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// disk makes a loop device of size MiB, named /dev/disk/by-id/<name> as a slot NVMe is.
func (r *labRig) disk(t *testing.T, mib int) string {
	t.Helper()
	r.n++
	file := filepath.Join(t.TempDir(), "disk.img")
	run(t, "truncate", "-s", strconv.Itoa(mib)+"M", file)
	dev := run(t, "losetup", "-f", "--show", file)
	t.Cleanup(func() {
		labguest.DestroyDomainsUsing(dev)
		_ = exec.Command("losetup", "-d", dev).Run()
	})
	link := fmt.Sprintf("/dev/disk/by-id/gpuaas-labnuma-%d-%d", os.Getpid(), r.n)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(link)
	if err := os.Symlink(dev, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(link) })
	return link
}

// plan is a provision plan of slots on the given NUMA nodes with the given host CPU sets, one
// vCPU and memMiB each; the first slot boots.
func (r *labRig) plan(t *testing.T, alloc string, host int, nodes []int, cpus []string, hk string, memMiB int) *task.VMProvision {
	t.Helper()
	p := &task.VMProvision{AllocationID: alloc, HousekeepingCPUs: hk,
		Profile: task.Profile{Name: "lab", GPUCount: len(nodes), VCPUCount: len(nodes), MemoryMiB: memMiB * len(nodes)},
		Image: task.Image{Slug: "lab-guest", SourceType: "http", SourceRef: "file://" + r.img.Path, DigestSHA256: r.img.SHA256,
			Format: "qcow2", Username: "debian"}}
	for i, n := range nodes {
		size := 8 + i // a size of its own, so the guest's view can be matched to the slot
		if i == 0 {
			size = 96
		}
		node := n
		p.Bundles = append(p.Bundles, task.Bundle{SlotID: fmt.Sprintf("%s-s%d", alloc[:8], i), SlotIndex: i,
			GPUPCI: fmt.Sprintf("0000:%02x:%02x.0", 0x10+host, i), FabricVFPCI: fmt.Sprintf("0000:%02x:%02x.2", 0x80+host, i),
			NVMeDevice: r.disk(t, size), NUMANode: &node, MACAddress: fmt.Sprintf("52:54:00:4e:%02x:%02x", host, i),
			PrivateIP: fmt.Sprintf("%s%d", r.subnet, 10+host*10+i), WipePolicy: "blkdiscard_zero_verify",
			VCPUCount: 1, MemoryMiB: memMiB, HostCPUs: cpus[i]})
	}
	return p
}

// provision runs the lab runtime's provision and registers the release.
func (r *labRig) provision(t *testing.T, p *task.VMProvision) []task.Phase {
	t.Helper()
	t.Cleanup(func() { r.h.destroyAndUndefine(VMName(p.AllocationID)) })
	rec := &Recorder{TaskID: "t-" + p.AllocationID[:8]}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if _, err := r.h.Provision(ctx, p, rec); err != nil {
		t.Fatalf("provision %s: %v\nphases: %+v", p.AllocationID, err, rec.Phases())
	}
	t.Cleanup(func() {
		rel := &task.VMRelease{AllocationID: p.AllocationID, Bundles: p.Bundles, GracefulTimeoutS: 5}
		if _, err := r.h.Release(context.Background(), rel, &Recorder{}); err != nil {
			t.Errorf("release %s: %v", p.AllocationID, err)
		}
	})
	return rec.Phases()
}

// guest runs a command in the slice over the relay key (as readiness does).
func (r *labRig) guest(t *testing.T, p *task.VMProvision, cmd string) string {
	t.Helper()
	signer, _, err := EnsureTerminalKey(r.h.cfg.TerminalKeyPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := net.JoinHostPort(p.Bundles[0].PrivateIP, "22")
	cl, err := dialGuest(ctx, addr, p.Image.Username, signer, filepath.Join(r.h.SliceDir(p.AllocationID), "guest_host_key"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	out, err := runSSH(cl, cmd)
	if err != nil {
		t.Fatalf("guest %q: %v\n%s", cmd, err, out)
	}
	return string(out)
}

func phaseDetail(phases []task.Phase, name string) string {
	for _, p := range phases {
		if p.Name == name {
			return p.Detail
		}
	}
	return ""
}

// An 8-slot VM whose slots span NUMA nodes 0 and 1 shows its guest two NUMA nodes, and each
// slot's disk on its slot's node, although this lab host may have a single node: the guest
// topology follows the slots, and the provision detail says what the host could not bind.
func TestLabEightSlotVMShowsGuestTwoNUMANodes(t *testing.T) {
	r := newLabRig(t)
	nodes := []int{0, 0, 0, 0, 1, 1, 1, 1}
	var cpus []string
	for i := range nodes {
		cpus = append(cpus, strconv.Itoa(200+i)) // production-like sets this lab host lacks
	}
	p := r.plan(t, fmt.Sprintf("a1%06d-0000-4000-8000-000000000031", os.Getpid()%1000000), 1, nodes, cpus, "199", 64)
	phases := r.provision(t, p)
	d := phaseDetail(phases, "domain_define_start")
	for _, want := range []string{"2 guest NUMA cell(s) for host node(s) 0-1", "lab host"} {
		if !strings.Contains(d, want) {
			t.Errorf("domain_define_start detail %q does not say %q", d, want)
		}
	}
	if _, err := os.Stat("/sys/devices/system/node/node1"); err != nil && !strings.Contains(d, "NUMA node 1 absent here") {
		t.Errorf("this host lacks node 1 and the detail does not say so: %q", d)
	}
	// The guest's own view: its NUMA nodes, and for each SCSI disk its serial (the slot) and
	// the numa_node of the PCI device it hangs from.
	out := r.guest(t, p, `ls -d /sys/devices/system/node/node[0-9]*; for d in /sys/bus/scsi/devices/*:*:*:*; do `+
		`p=$(readlink -f $d); while [ -n "$p" ] && [ ! -f $p/numa_node ]; do p=${p%/*}; done; `+
		`echo "disk $(cat $d/vpd_pg80 2>/dev/null | tr -dc 'A-Za-z0-9-') $(cat $p/numa_node 2>/dev/null)"; done`)
	t.Logf("guest:\n%s", out)
	var guestNodes []string
	slotNode := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 1 && strings.HasPrefix(f[0], "/sys/devices/system/node/node"):
			guestNodes = append(guestNodes, strings.TrimPrefix(f[0], "/sys/devices/system/node/"))
		case len(f) == 3 && f[0] == "disk":
			if i := strings.Index(f[1], "gpuaas-slot"); i >= 0 {
				slotNode[f[1][i+len("gpuaas-slot"):]] = f[2]
			}
		}
	}
	sort.Strings(guestNodes)
	if strings.Join(guestNodes, ",") != "node0,node1" {
		t.Errorf("guest NUMA nodes %v, want node0,node1", guestNodes)
	}
	for i, n := range nodes {
		if got := slotNode[strconv.Itoa(i)]; got != strconv.Itoa(n) {
			t.Errorf("slot %d disk: guest numa_node %q, want %d (all: %v)", i, got, n, slotNode)
		}
	}
}

// vcpuPins reads a running domain's vCPU pinning back from libvirt (virsh vcpupin: one
// "VCPU  CPU-Affinity" row per vCPU): vCPU -> host CPUs.
func vcpuPins(t *testing.T, name string) map[int][]int {
	t.Helper()
	out := run(t, "virsh", "-c", "qemu:///system", "vcpupin", name)
	pins := map[int][]int{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		if pins[n], err = cpuset.Parse(f[1]); err != nil {
			t.Fatalf("vcpupin %s: %q: %v", name, l, err)
		}
	}
	if len(pins) == 0 {
		t.Fatalf("vcpupin %s: no pins in %q", name, out)
	}
	return pins
}

// threadAffinity is the kernel's CPU affinity of each vCPU thread, as libvirt reads it
// (virsh vcpuinfo: "CPU Affinity: y-y-", one character per host CPU).
func threadAffinity(t *testing.T, name string) [][]int {
	t.Helper()
	out := run(t, "virsh", "-c", "qemu:///system", "vcpuinfo", name)
	var aff [][]int
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "CPU Affinity:"); ok {
			var set []int
			for c, ch := range strings.TrimSpace(rest) {
				if ch == 'y' {
					set = append(set, c)
				}
			}
			aff = append(aff, set)
		}
	}
	return aff
}

// emulatorPin reads the emulator threads' live pinning (virsh emulatorpin: "*: CPUS").
func emulatorPin(t *testing.T, name string) []int {
	t.Helper()
	out := run(t, "virsh", "-c", "qemu:///system", "emulatorpin", name)
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "*:"); ok {
			set, err := cpuset.Parse(rest)
			if err != nil {
				t.Fatalf("emulatorpin %s: %q: %v", name, l, err)
			}
			return set
		}
	}
	t.Fatalf("emulatorpin %s: no pin in %q", name, out)
	return nil
}

// Two slices on one NUMA node run on disjoint host CPUs, as libvirt reports their live
// pinning: each VM's vCPUs on its own slot's CPU, the emulator threads on the housekeeping CPU
// when this host has one to spare.
func TestLabTwoVMsOnOneNodeHaveDisjointLivePins(t *testing.T) {
	r := newLabRig(t)
	b, err := os.ReadFile("/sys/devices/system/node/node0/cpulist")
	if err != nil {
		t.Fatal(err)
	}
	host, err := cpuset.Parse(string(b))
	if err != nil || len(host) < 2 {
		t.Skipf("the lab host's node 0 has CPUs %v: two slots need two", host)
	}
	// Housekeeping first, then one CPU per slot; on a 2-CPU host the housekeeping CPU is one
	// the host lacks (the lab says so and leaves the emulator unpinned).
	hk, a, c := host[0], host[1], 0
	if len(host) >= 3 {
		c = host[2]
	} else {
		hk, a, c = host[len(host)-1]+1, host[0], host[1]
	}
	var plans []*task.VMProvision
	var phases [][]task.Phase
	for i, cpu := range []int{a, c} {
		p := r.plan(t, fmt.Sprintf("b%d%06d-0000-4000-8000-000000000031", i, os.Getpid()%1000000), 2+i, []int{0}, []string{strconv.Itoa(cpu)}, strconv.Itoa(hk), 256)
		plans = append(plans, p)
		phases = append(phases, r.provision(t, p))
	}
	var used [][]int
	for i, p := range plans {
		name := VMName(p.AllocationID)
		if st, err := r.h.cfg.Hypervisor.State(name); err != nil || st != hypervisor.Running {
			t.Fatalf("%s: %s %v", name, st, err)
		}
		want, _ := cpuset.Parse(p.Bundles[0].HostCPUs)
		var all []int
		for v, set := range vcpuPins(t, name) {
			if cpuset.Format(set) != cpuset.Format(want) {
				t.Errorf("%s vCPU %d live pin %s, want its slot's CPU %s", name, v, cpuset.Format(set), p.Bundles[0].HostCPUs)
			}
			all = cpuset.Union(all, set)
		}
		used = append(used, all)
		aff := threadAffinity(t, name)
		if len(aff) != p.Bundles[0].VCPUCount {
			t.Fatalf("%s: vcpuinfo shows %d vCPU threads, want %d", name, len(aff), p.Bundles[0].VCPUCount)
		}
		for v, set := range aff {
			if cpuset.Format(set) != cpuset.Format(want) {
				t.Errorf("%s vCPU %d thread runs on %s, want its slot's CPU %s", name, v, cpuset.Format(set), p.Bundles[0].HostCPUs)
			}
		}
		emu := emulatorPin(t, name)
		if len(host) >= 3 && cpuset.Format(emu) != strconv.Itoa(hk) {
			t.Errorf("%s emulator pin %s, want housekeeping CPU %d", name, cpuset.Format(emu), hk)
		}
		t.Logf("%s: vCPUs on %s, emulator on %s; %s", name, cpuset.Format(all), cpuset.Format(emu), phaseDetail(phases[i], "domain_define_start"))
	}
	if both := cpuset.Overlap(used[0], used[1]); len(both) > 0 {
		t.Fatalf("two VMs on NUMA node 0 share host CPUs %s", cpuset.Format(both))
	}
}
